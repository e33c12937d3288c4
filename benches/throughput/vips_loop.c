/* The floor a plain libvips program sets for the `variants` outputs: each photo decoded once
 * (shrink-on-load to the widest width, upright, sRGB), every narrower width resized from that
 * decode, each saved as WebP and JPEG (flattened onto white) into memory, no metadata, libvips
 * defaults otherwise. One thread, like one job of the worker's pool.
 *
 *   vips_loop <webp Q> <jpeg Q> <widths, comma-separated> <photo>...
 * Prints the bytes written per photo; exits 1 on the first error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vips/vips.h>

static int save(VipsImage *v, int qw, int qj, size_t *bytes) {
  void *buf;
  size_t len;
  if (vips_webpsave_buffer(v, &buf, &len, "Q", qw, "strip", TRUE, NULL)) return -1;
  g_free(buf);
  *bytes += len;
  VipsImage *flat = NULL;
  if (vips_image_hasalpha(v)) {
    VipsArrayDouble *white = vips_array_double_newv(1, 255.0);
    int r = vips_flatten(v, &flat, "background", white, NULL);
    vips_area_unref(VIPS_AREA(white));
    if (r) return -1;
  }
  int r = vips_jpegsave_buffer(flat ? flat : v, &buf, &len, "Q", qj, "strip", TRUE, NULL);
  if (flat) g_object_unref(flat);
  if (r) return -1;
  g_free(buf);
  *bytes += len;
  return 0;
}

int main(int argc, char **argv) {
  if (VIPS_INIT(argv[0])) vips_error_exit(NULL);
  if (argc < 5) vips_error_exit("usage: vips_loop webpQ jpegQ w1,w2,.. photo...");
  vips_concurrency_set(1);
  vips_cache_set_max(0);
  int qw = atoi(argv[1]), qj = atoi(argv[2]);
  int widths[16], n = 0;
  for (char *w = strtok(argv[3], ","); w && n < 16; w = strtok(NULL, ",")) widths[n++] = atoi(w);
  int widest = 0;
  for (int i = 0; i < n; i++) widest = widths[i] > widest ? widths[i] : widest;
  for (int f = 4; f < argc; f++) {
    VipsImage *thumb, *decoded;
    if (vips_thumbnail(argv[f], &thumb, widest, "height", 100000, "size", VIPS_SIZE_DOWN, NULL))
      vips_error_exit("%s", argv[f]);
    if (!(decoded = vips_image_copy_memory(thumb))) vips_error_exit("%s", argv[f]);
    g_object_unref(thumb);
    /* The widths below the decode's, resized from it, and the decode itself (the widest, or
     * the source's own width when it is narrower): the worker's plan. */
    size_t bytes = 0;
    if (save(decoded, qw, qj, &bytes)) vips_error_exit("%s", argv[f]);
    for (int i = 0; i < n; i++) {
      if (widths[i] >= decoded->Xsize) continue;
      VipsImage *v;
      if (vips_resize(decoded, &v, (double)widths[i] / decoded->Xsize, NULL) ||
          save(v, qw, qj, &bytes))
        vips_error_exit("%s", argv[f]);
      g_object_unref(v);
    }
    g_object_unref(decoded);
    printf("%s\t%zu\n", argv[f], bytes);
  }
  vips_shutdown();
  return 0;
}
