//! The video inputs the worker takes and the ffmpeg components its runs use: the one list in
//! config/ffmpeg-components, built in. The same file configures the image's ffmpeg
//! (scripts/ffmpeg-configure.sh in the Dockerfile) and is what tests/container.rs asks of it, so
//! that the image takes what the worker takes on any host.
//!
//! - Inputs: each sniffed container ([`Container::demuxer`]) may carry the codecs its line lists
//!   (codecs and families of codecs, by ffprobe's names). A video whose video stream, or first
//!   audio stream, is anything else is refused at probe ([`check`]: `unsupported_media`), on
//!   the host as in the image, where ffmpeg has no decoder for it.
//! - Components: `uses` lines are what the argument builders name (encoders, filters, muxers;
//!   the tests of `uses.rs` derive them from every profile's runs), `implies` lines what ffmpeg
//!   adds to those runs by itself (conversions, autorotation's filters) and what they read
//!   without naming it.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use crate::media::error::MediaError;
use crate::media::sniff::Container;

const LIST: &str = include_str!("../../../config/ffmpeg-components");

/// Where a component line comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// Named by the worker's arguments.
    Uses,
    /// Added by ffmpeg, or read without a name.
    Implies,
}

/// config/ffmpeg-components, parsed.
#[derive(Debug, Default)]
pub struct Components {
    /// Each container's demuxer and the codecs it may carry, families expanded.
    containers: Vec<(String, Vec<String>)>,
    /// Components by origin and kind (`encoder`, `filter`, `muxer`, ...).
    components: BTreeMap<(Origin, String), Vec<String>>,
}

/// The built-in list.
pub fn list() -> &'static Components {
    static LIST_PARSED: LazyLock<Components> = LazyLock::new(|| {
        Components::parse(LIST).unwrap_or_else(|e| panic!("config/ffmpeg-components: {e}"))
    });
    &LIST_PARSED
}

impl Components {
    /// The list's text: `container`, `family`, `codec`, `uses` and `implies` lines (see its
    /// header); `#` starts a comment.
    pub fn parse(text: &str) -> Result<Components, String> {
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| {
                l.split('#')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect()
            })
            .filter(|w: &Vec<&str>| !w.is_empty())
            .collect();
        let mut families = BTreeMap::new();
        for w in &lines {
            if w[0] == "family" && w.len() > 2 {
                families.insert(w[1], &w[2..]);
            }
        }
        let mut list = Components::default();
        for w in &lines {
            let (kind, name, rest) = match w.as_slice() {
                [kind, name, rest @ ..] if !rest.is_empty() => (*kind, *name, rest),
                _ => return Err(format!("`{}`: too short", w.join(" "))),
            };
            match kind {
                "container" => {
                    let codecs = rest
                        .iter()
                        .flat_map(|item| {
                            families
                                .get(item)
                                .copied()
                                .unwrap_or(std::slice::from_ref(item))
                        })
                        .map(|c| c.to_string())
                        .collect();
                    list.containers.push((name.to_owned(), codecs));
                }
                "uses" | "implies" => {
                    let origin = if kind == "uses" {
                        Origin::Uses
                    } else {
                        Origin::Implies
                    };
                    list.components
                        .entry((origin, name.to_owned()))
                        .or_default()
                        .extend(rest.iter().map(|n| n.to_string()));
                }
                "family" | "codec" => {}
                _ => return Err(format!("`{}`: no such line", w.join(" "))),
            }
        }
        Ok(list)
    }

    /// The containers' demuxers and the codecs each may carry.
    pub fn containers(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.containers
            .iter()
            .map(|(d, codecs)| (d.as_str(), codecs.as_slice()))
    }

    /// The codecs a container (by its demuxer) may carry; None for one not in the list.
    pub fn codecs(&self, demuxer: &str) -> Option<&[String]> {
        self.containers()
            .find(|(d, _)| *d == demuxer)
            .map(|(_, codecs)| codecs)
    }

    /// The components of `kind` from `origin`'s lines.
    pub fn named(&self, origin: Origin, kind: &str) -> &[String] {
        self.components
            .get(&(origin, kind.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    /// Every component of `kind`, both origins.
    pub fn all(&self, kind: &str) -> Vec<&str> {
        [Origin::Uses, Origin::Implies]
            .iter()
            .flat_map(|o| self.named(*o, kind))
            .map(String::as_str)
            .collect()
    }
}

/// Whether a probed video is what `container` may carry: its video codec and its first audio
/// stream's (ffprobe's names).
pub fn check(container: Container, video: &str, audio: Option<&str>) -> Result<(), MediaError> {
    let demuxer = container.demuxer();
    let codecs = list().codecs(demuxer).unwrap_or(&[]);
    for (what, codec) in [("video", Some(video)), ("audio", audio)] {
        if let Some(codec) = codec
            && !codecs.iter().any(|c| c == codec)
        {
            return Err(MediaError::Unsupported(format!(
                "{codec} {what} in a {demuxer} file is not accepted"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sniffed_container_has_its_line_and_every_line_a_container() {
        let demuxers: Vec<&str> = Container::ALL.iter().map(|c| c.demuxer()).collect();
        let listed: Vec<&str> = list().containers().map(|(d, _)| d).collect();
        assert_eq!(listed, demuxers);
        for (d, codecs) in list().containers() {
            assert!(!codecs.is_empty(), "{d}");
        }
    }

    #[test]
    fn families_expand_and_unknown_lines_are_refused() {
        let l = Components::parse(
            "family a x y # two\ncontainer mov a z\nuses filter scale\nimplies filter null\n",
        )
        .unwrap();
        assert_eq!(l.codecs("mov").unwrap(), ["x", "y", "z"]);
        assert_eq!(l.codecs("avi"), None);
        assert_eq!(l.all("filter"), ["scale", "null"]);
        assert!(Components::parse("contaner mov h264").is_err());
        assert!(Components::parse("container mov").is_err());
    }

    #[test]
    fn a_stream_the_container_may_not_carry_is_refused() {
        // The examples: AMR in 3GP, MS-MPEG4 and ADPCM in AVI, DTS and TrueHD in
        // Matroska, DNxHD and 8-bit PCM in QuickTime.
        let ok = [
            (Container::IsoBmff, "h263", Some("amr_nb")),
            (Container::IsoBmff, "dnxhd", Some("pcm_s8")),
            (Container::Avi, "msmpeg4v3", Some("adpcm_ima_wav")),
            (Container::Matroska, "hevc", Some("truehd")),
            (Container::Matroska, "vp9", Some("dts")),
            (Container::Gif, "gif", None),
        ];
        for (c, v, a) in ok {
            assert!(check(c, v, a).is_ok(), "{c:?} {v} {a:?}");
        }
        let refused = [
            (
                Container::Avi,
                "cinepak",
                None,
                "cinepak video in a avi file",
            ),
            (Container::Avi, "hevc", Some("aac"), "hevc video"),
            (Container::IsoBmff, "h264", Some("qdm2"), "qdm2 audio"),
            (Container::Matroska, "theora", None, "theora video"),
        ];
        for (c, v, a, why) in refused {
            match check(c, v, a) {
                Err(MediaError::Unsupported(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{c:?} {v} {a:?}: {other:?}"),
            }
        }
    }
}
