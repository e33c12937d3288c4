//! Stage 4: what the response's `analysis` says about an image.

use super::Probe;
use crate::contract::Analysis;

pub fn run(probe: &Probe) -> Analysis {
    Analysis {
        width: probe.width,
        height: probe.height,
        format: probe.format.name().to_owned(),
        has_alpha: probe.has_alpha,
        animated: probe.frames > 1,
        frames: probe.frames,
        orientation: probe.orientation,
    }
}
