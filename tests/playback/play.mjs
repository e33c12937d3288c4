// Plays a stream in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core)
// with hls.js and with dash.js: node play.mjs STREAM_DIR PLAYER_MODULES AT_SECONDS OUT_DIR.
// STREAM_DIR holds hls/master.m3u8 and hls/manifest.mpd; it is served over a local HTTP server
// with the player page. Prints one JSON report per player on stdout; the frame each showed at
// AT_SECONDS goes to OUT_DIR/<player>.png.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const [dir, modules, at, out] = process.argv.slice(2);
const require = createRequire(path.join(modules, 'node_modules', 'x.js'));
const { chromium } = require('playwright-core');
const here = path.dirname(new URL(import.meta.url).pathname);
const files = {
  '/player.html': path.join(here, 'player.html'),
  '/lib/hls.js': path.join(modules, 'node_modules/hls.js/dist/hls.min.js'),
  '/lib/dash.js': path.join(modules, 'node_modules/dashjs/dist/modern/umd/dash.all.min.js'),
};
const types = { '.html': 'text/html', '.js': 'text/javascript', '.m3u8': 'application/vnd.apple.mpegurl',
  '.mpd': 'application/dash+xml', '.mp4': 'video/mp4', '.m4s': 'video/iso.segment' };
const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const file = files[url.pathname] ?? (url.pathname.startsWith('/stream/')
    ? path.join(dir, path.normalize(url.pathname.slice('/stream/'.length)).replace(/^(\.\.[/\\])+/, ''))
    : null);
  if (url.pathname === '/favicon.ico') { res.writeHead(204); res.end(); return; }
  if (!file || !fs.existsSync(file)) { res.writeHead(404); res.end(); return; }
  res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream' });
  fs.createReadStream(file).pipe(res);
});
await new Promise(ok => server.listen(0, '127.0.0.1', ok));
const base = `http://127.0.0.1:${server.address().port}`;
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--autoplay-policy=no-user-gesture-required'],
});
try {
  const players = [['hls', 'hls/master.m3u8'], ['dash', 'hls/manifest.mpd']]
    .filter(([p]) => !process.env.PLAYER || process.env.PLAYER === p);
  for (const [player, entry] of players) {
    const page = await browser.newPage();
    const console_ = [];
    page.on('console', m => { if (m.type() === 'error') console_.push(m.text()); });
    page.on('pageerror', e => console_.push(String(e)));
    const src = `${base}/stream/${entry}`;
    await page.goto(`${base}/player.html?player=${player}&src=${encodeURIComponent(src)}&at=${at}&wait=${process.env.WAIT_MS ?? 30000}`);
    // The page's own waits time out first; this one only guards against a hung page.
    await page.waitForFunction(() => window.report && window.report.done, null, { timeout: 300000 })
      .catch(() => {});
    const report = await page.evaluate(() => window.report);
    report.console = console_;
    if (report.frame) {
      const png = Buffer.from(report.frame.replace(/^data:image\/png;base64,/, ''), 'base64');
      fs.writeFileSync(path.join(out, `${player}.png`), png);
      delete report.frame;
    }
    process.stdout.write(JSON.stringify(report) + '\n');
    await page.close();
  }
} finally {
  await browser.close();
  server.close();
}
