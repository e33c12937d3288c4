// Links our small libvips FFI layer (src/media/vips.rs) against the system libvips via pkg-config.
fn main() {
    pkg_config::Config::new()
        .atleast_version("8.12")
        .probe("vips")
        .expect("libvips >= 8.12 not found (apt-get install libvips-dev)");
}
