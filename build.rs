// Links our small FFI layers (src/media/vips.rs, webpmux.rs) against the system libvips and
// libwebpmux via pkg-config.
fn main() {
    pkg_config::Config::new()
        .atleast_version("8.12")
        .probe("vips")
        .expect("libvips >= 8.12 not found (apt-get install libvips-dev)");
    // Metadata removal after webpsave (src/media/webpmux.rs); libvips itself links it.
    pkg_config::Config::new()
        .atleast_version("1.2")
        .probe("libwebpmux")
        .expect("libwebpmux >= 1.2 not found (apt-get install libwebp-dev)");
}
