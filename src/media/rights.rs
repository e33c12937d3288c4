//! `keep_metadata = ["copyright"]`: the source's rights fields, and only those, written into
//! the outputs that can carry them. Everything else the source carried (GPS, dates, device,
//! thumbnails, comments) stays out, as with the default (strip all): the decoded pixels carry
//! nothing ([`super::transform::decode`]) and these fields are rebuilt from scratch:
//! - EXIF `Copyright` and `Artist` (IFD0), in a new TIFF structure (`kamadak-exif`);
//! - XMP `dc:rights` and `dc:creator`, copied into a new packet;
//! - IPTC `CopyrightNotice` (2:116) and `By-line` (2:80), with the character set (1:90), in a
//!   new Photoshop resource.
//!
//! JPEG outputs get all three (APP1 Exif, APP1 XMP, APP13); WebP gets EXIF and XMP chunks
//! (it has no IPTC); AVIF gets none (libvips 8.14's heifsave adds fields of its own to any
//! EXIF it writes).

use std::io::Cursor;

use exif::{In, Tag};

use crate::contract::OutputFormat;

/// The rights fields of one source, ready to be written.
#[derive(Debug, Default)]
pub struct Rights {
    /// A TIFF structure with IFD0's `Copyright` and `Artist`.
    exif: Option<Vec<u8>>,
    xmp: Option<Vec<u8>>,
    /// IPTC-IIM datasets.
    iptc: Option<Vec<u8>>,
}

const EXIF_HEADER: &[u8] = b"Exif\0\0";
const XMP_HEADER: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";
const PHOTOSHOP_HEADER: &[u8] = b"Photoshop 3.0\0";

impl Rights {
    /// From the source's metadata blobs as libvips names them (`exif-data`, `xmp-data`,
    /// `iptc-data`); a blob that does not parse gives nothing.
    pub fn from_blobs(exif: Option<&[u8]>, xmp: Option<&[u8]>, iptc: Option<&[u8]>) -> Rights {
        Rights {
            exif: exif.and_then(exif_rights),
            xmp: xmp.and_then(xmp_rights),
            iptc: iptc.and_then(iptc_rights),
        }
    }

    /// The rights fields of the image file `path` (its header only is read).
    pub fn of_file(path: &std::path::Path) -> Rights {
        let Ok(header) = super::vips::Image::open_header(path) else {
            return Rights::default();
        };
        Rights::from_blobs(
            header.blob(c"exif-data").as_deref(),
            header.blob(c"xmp-data").as_deref(),
            header.blob(c"iptc-data").as_deref(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.exif.is_none() && self.xmp.is_none() && self.iptc.is_none()
    }

    /// `encoded` (an output of `format`, without metadata) with the fields it can carry.
    pub fn write(&self, format: OutputFormat, encoded: Vec<u8>) -> Result<Vec<u8>, String> {
        if self.is_empty() {
            return Ok(encoded);
        }
        match format {
            OutputFormat::Jpeg => Ok(self.jpeg_with(&encoded)),
            OutputFormat::Webp => {
                super::webpmux::set_metadata(&encoded, self.exif.as_deref(), self.xmp.as_deref())
            }
            OutputFormat::Avif => Ok(encoded),
        }
    }

    /// Segments after SOI: APP1 Exif, APP1 XMP, APP13 Photoshop (IPTC).
    fn jpeg_with(&self, jpeg: &[u8]) -> Vec<u8> {
        let mut segments = Vec::new();
        let mut segment = |marker: u8, parts: &[&[u8]]| {
            let len: usize = 2 + parts.iter().map(|p| p.len()).sum::<usize>();
            // A segment holds at most 65,533 bytes; rights fields never come near.
            if len > u16::MAX as usize {
                return;
            }
            segments.extend_from_slice(&[0xFF, marker]);
            segments.extend_from_slice(&(len as u16).to_be_bytes());
            for p in parts {
                segments.extend_from_slice(p);
            }
        };
        if let Some(exif) = &self.exif {
            segment(0xE1, &[EXIF_HEADER, exif]);
        }
        if let Some(xmp) = &self.xmp {
            segment(0xE1, &[XMP_HEADER, xmp]);
        }
        if let Some(iptc) = &self.iptc {
            segment(0xED, &[PHOTOSHOP_HEADER, &photoshop_iptc(iptc)]);
        }
        let mut out = Vec::with_capacity(jpeg.len() + segments.len());
        out.extend_from_slice(&jpeg[..2]);
        out.extend_from_slice(&segments);
        out.extend_from_slice(&jpeg[2..]);
        out
    }
}

/// A new TIFF structure with only IFD0's `Copyright` and `Artist`, if the source had either.
fn exif_rights(blob: &[u8]) -> Option<Vec<u8>> {
    let tiff = blob.strip_prefix(EXIF_HEADER).unwrap_or(blob);
    let exif = exif::Reader::new().read_raw(tiff.to_vec()).ok()?;
    let kept: Vec<&exif::Field> = [Tag::Copyright, Tag::Artist]
        .into_iter()
        .filter_map(|t| exif.get_field(t, In::PRIMARY))
        .collect();
    if kept.is_empty() {
        return None;
    }
    let mut writer = exif::experimental::Writer::new();
    for f in kept {
        writer.push_field(f);
    }
    let mut out = Cursor::new(Vec::new());
    writer.write(&mut out, false).ok()?;
    Some(out.into_inner())
}

/// A new XMP packet with only the source's `dc:rights` and `dc:creator` elements.
fn xmp_rights(blob: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(blob).ok()?;
    let element = |name: &str| {
        let (open, close) = (format!("<{name}>"), format!("</{name}>"));
        let start = text.find(&open)?;
        let end = text[start..].find(&close)? + start + close.len();
        Some(&text[start..end])
    };
    let kept: String = ["dc:rights", "dc:creator"]
        .into_iter()
        .filter_map(element)
        .collect();
    if kept.is_empty() {
        return None;
    }
    Some(
        format!(
            "<?xpacket begin=\"\u{feff}\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\
             <x:xmpmeta xmlns:x=\"adobe:ns:meta/\">\
             <rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">\
             <rdf:Description rdf:about=\"\" xmlns:dc=\"http://purl.org/dc/elements/1.1/\">\
             {kept}</rdf:Description></rdf:RDF></x:xmpmeta><?xpacket end=\"r\"?>"
        )
        .into_bytes(),
    )
}

/// IIM datasets kept: the character set, the record version, By-line and CopyrightNotice.
const IIM_KEPT: [(u8, u8); 4] = [(1, 90), (2, 0), (2, 80), (2, 116)];

/// The IPTC-IIM datasets kept from a Photoshop resource block (libvips' `iptc-data`), if any
/// of the rights ones is there.
fn iptc_rights(blob: &[u8]) -> Option<Vec<u8>> {
    let resources = blob.strip_prefix(PHOTOSHOP_HEADER).unwrap_or(blob);
    let iim = photoshop_resource(resources, 0x0404)?;
    let mut kept = Vec::new();
    let mut rights = false;
    let mut at = 0;
    while at + 5 <= iim.len() && iim[at] == 0x1C {
        let (record, dataset) = (iim[at + 1], iim[at + 2]);
        let len = u16::from_be_bytes([iim[at + 3], iim[at + 4]]) as usize;
        // An extended length (high bit) is for large binary datasets, never rights.
        if len & 0x8000 != 0 || at + 5 + len > iim.len() {
            break;
        }
        if IIM_KEPT.contains(&(record, dataset)) {
            kept.extend_from_slice(&iim[at..at + 5 + len]);
            rights |= record == 2 && dataset != 0;
        }
        at += 5 + len;
    }
    rights.then_some(kept)
}

/// The data of resource `id` in a sequence of Photoshop `8BIM` resources.
fn photoshop_resource(mut data: &[u8], id: u16) -> Option<&[u8]> {
    while data.len() >= 12 && &data[..4] == b"8BIM" {
        let this = u16::from_be_bytes([data[4], data[5]]);
        // A Pascal name, padded to an even length.
        let name = 1 + data[6] as usize;
        let at = 6 + name + name % 2;
        let size_bytes = data.get(at..at + 4)?;
        let size = u32::from_be_bytes(size_bytes.try_into().ok()?) as usize;
        let body = data.get(at + 4..at + 4 + size)?;
        if this == id {
            return Some(body);
        }
        data = data.get(at + 4 + size + size % 2..)?;
    }
    None
}

/// A Photoshop resource block holding `iim` as its IPTC-NAA resource.
fn photoshop_iptc(iim: &[u8]) -> Vec<u8> {
    let mut out = b"8BIM\x04\x04\0\0".to_vec();
    out.extend_from_slice(&(iim.len() as u32).to_be_bytes());
    out.extend_from_slice(iim);
    if iim.len() % 2 == 1 {
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_rights_datasets_of_iptc_are_kept() {
        let dataset = |r: u8, d: u8, v: &[u8]| {
            let mut b = vec![0x1C, r, d];
            b.extend_from_slice(&(v.len() as u16).to_be_bytes());
            b.extend_from_slice(v);
            b
        };
        let iim = [
            dataset(1, 90, b"\x1b%G"),
            dataset(2, 0, b"\0\x04"),
            dataset(2, 55, b"20240101"),
            dataset(2, 80, b"Ada"),
            dataset(2, 116, b"(c) Ada"),
            dataset(2, 90, b"Paris"),
        ]
        .concat();
        let mut blob = PHOTOSHOP_HEADER.to_vec();
        blob.extend(photoshop_iptc(&iim));
        let kept = iptc_rights(&blob).unwrap();
        let expect = [
            dataset(1, 90, b"\x1b%G"),
            dataset(2, 0, b"\0\x04"),
            dataset(2, 80, b"Ada"),
            dataset(2, 116, b"(c) Ada"),
        ]
        .concat();
        assert_eq!(kept, expect);
        // Without a rights dataset there is nothing to keep.
        let none = [dataset(1, 90, b"\x1b%G"), dataset(2, 55, b"20240101")].concat();
        assert_eq!(iptc_rights(&photoshop_iptc(&none)), None);
    }

    #[test]
    fn only_dc_rights_and_creator_of_xmp_are_kept() {
        let xmp = r#"<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description
            xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:rights><rdf:Alt><rdf:li
            xml:lang="x-default">(c) Ada</rdf:li></rdf:Alt></dc:rights><exif:GPSLatitude>48,51N
            </exif:GPSLatitude><dc:creator><rdf:Seq><rdf:li>Ada</rdf:li></rdf:Seq></dc:creator>
            </rdf:Description></rdf:RDF></x:xmpmeta>"#;
        let kept = String::from_utf8(xmp_rights(xmp.as_bytes()).unwrap()).unwrap();
        assert!(kept.contains("(c) Ada</rdf:li></rdf:Alt></dc:rights>"));
        assert!(kept.contains("<dc:creator><rdf:Seq><rdf:li>Ada</rdf:li>"));
        assert!(!kept.contains("GPS"));
        assert_eq!(
            xmp_rights(b"<x:xmpmeta><exif:GPSLatitude/></x:xmpmeta>"),
            None
        );
    }
}
