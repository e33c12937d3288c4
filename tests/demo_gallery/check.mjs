// Opens the demo's gallery in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core): node check.mjs URL PLAYER_MODULES SCREENSHOT. Waits for every image, plays
// the first stream to past 1 s, takes a full-page screenshot and prints one JSON report: the
// console errors and failed requests, the images that did not decode, per card its status, text
// and face boxes (as fractions of the picture they are drawn over), and the player's state.
import path from 'node:path';
import { createRequire } from 'node:module';

const [url, modules, screenshot] = process.argv.slice(2);
const require = createRequire(path.join(modules, 'node_modules', 'x.js'));
const { chromium } = require('playwright-core');

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--autoplay-policy=no-user-gesture-required'],
});
const report = { console: [], failedRequests: [] };
try {
  const page = await browser.newPage({ viewport: { width: 1500, height: 1000 } });
  page.on('console', m => { if (m.type() === 'error') report.console.push(m.text()); });
  page.on('pageerror', e => report.console.push(String(e)));
  // ERR_ABORTED is the browser dropping a request of its own (a video's rest once it has the
  // metadata, the <img> fallback a <picture> source replaces): not a failure of the page.
  page.on('requestfailed', r => {
    const error = r.failure()?.errorText;
    if (error !== 'net::ERR_ABORTED') report.failedRequests.push(`${r.url()}: ${error}`);
  });
  page.on('response', r => { if (r.status() >= 400) report.failedRequests.push(`${r.url()}: HTTP ${r.status()}`); });
  // `load` waits for every image; the storyboards' strips come after it.
  await page.goto(url, { waitUntil: 'load', timeout: 120000 });
  await page.waitForFunction(() => [...document.images].every(i => i.complete), null, { timeout: 60000 });
  report.images = await page.evaluate(() => [...document.images].map(i => ({ src: i.currentSrc || i.src, naturalWidth: i.naturalWidth })));
  report.cards = await page.evaluate(() => [...document.querySelectorAll('section.card')].map(card => {
    const img = card.querySelector('figure.stage picture img');
    const at = img && img.getBoundingClientRect();
    return {
      id: card.dataset.mediaId,
      status: card.dataset.status,
      text: card.innerText,
      picture: at ? { width: at.width, height: at.height, naturalWidth: img.naturalWidth, currentSrc: img.currentSrc } : null,
      faces: at ? [...card.querySelectorAll('.overlay .face')].map(f => {
        const r = f.getBoundingClientRect();
        return { x: (r.left - at.left) / at.width, y: (r.top - at.top) / at.height,
          width: r.width / at.width, height: r.height / at.height };
      }) : [],
    };
  }));
  report.summary = await page.evaluate(() => Object.fromEntries(
    [...document.querySelectorAll('[data-count]')].map(b => [b.dataset.count, +b.textContent])));
  // The first stream, played through the page's player.
  await page.waitForFunction(() => document.querySelectorAll('.scrub .tile').length > 0, null, { timeout: 30000 })
    .catch(() => {});
  report.storyboardTiles = await page.evaluate(() => document.querySelectorAll('.scrub .tile').length);
  report.video = await page.evaluate(async () => {
    const v = document.querySelector('video.player');
    if (!v) return null;
    v.scrollIntoView();
    await v.play();
    const t0 = performance.now();
    while (v.currentTime <= 1 && !v.error && performance.now() - t0 < 60000) await new Promise(ok => setTimeout(ok, 50));
    v.pause();
    return { player: v.dataset.player, src: v.src, currentTime: v.currentTime, videoWidth: v.videoWidth,
      videoHeight: v.videoHeight, error: v.error && v.error.message, hlsVersion: window.Hls && Hls.version };
  });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: screenshot, fullPage: true });
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(report) + '\n');
