// The `variants` outputs (and AVIF) made by sharp, as its users write them: one pipeline per output
// (auto-orient, resize without enlargement, sRGB, no metadata), JPEG flattened onto white.
//
//   node sharp.mjs <sharp module dir> <out dir>  < jobs (JSON lines)
// A job: {"source", "name", "widths": [..], "formats": [{"format", "quality", "mozjpeg"?}]}; one JSON line
// out per job: {"name", "outputs": [{"format", "width", "path"}], "cpu_ms": {format: ms}} or
// {"name", "error"}. sharp runs on one thread, like one job of the worker's pool.
import { createRequire } from "node:module";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

const [sharpDir, outDir] = process.argv.slice(2);
const sharp = createRequire(join(sharpDir, "package.json"))("sharp");
sharp.concurrency(1);
sharp.cache(false);

const cpuMs = (start) => {
  const d = process.cpuUsage(start);
  return (d.user + d.system) / 1000;
};

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const job = JSON.parse(line);
  const dir = join(outDir, job.name);
  mkdirSync(dir, { recursive: true });
  const outputs = [];
  const cpu = {};
  try {
    for (const { format, quality, mozjpeg = false } of job.formats) {
      const start = process.cpuUsage();
      for (const width of job.widths) {
        const ext = format === "jpeg" ? "jpg" : format;
        const path = join(dir, `${width}w.${ext}`);
        let p = sharp(job.source).autoOrient().resize({ width, withoutEnlargement: true });
        if (format === "jpeg") p = p.flatten({ background: "#ffffff" }).jpeg({ quality, mozjpeg });
        else if (format === "avif") p = p.avif({ quality }); // sharp's defaults: effort 4, 4:4:4
        else p = p.webp({ quality });
        const info = await p.toFile(path);
        outputs.push({ format, width: info.width, height: info.height, path, bytes: info.size });
      }
      cpu[format] = cpuMs(start);
    }
    console.log(JSON.stringify({ name: job.name, outputs, cpu_ms: cpu }));
  } catch (e) {
    console.log(JSON.stringify({ name: job.name, error: String(e) }));
  }
}
