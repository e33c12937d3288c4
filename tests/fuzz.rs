//! A fixed sample of mutation fuzzing through the sandboxed path (`make fuzz N=...` runs
//! more), and property tests of the two parsers every request and upload meets first.

#[path = "common/fuzz.rs"]
mod fuzz;

use std::path::Path;

use media_worker::config::Settings;
use media_worker::media::sniff::{self, ImageFormat, Sniffed};
use proptest::prelude::*;

/// 120 mutants (two of each corpus file, each kind of mutation on about half the corpus):
/// every one answered, no process left behind, nothing answered as a fault of the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_mutants_are_all_answered_and_contained() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let scratch = tempfile::tempdir().unwrap();
    let report = fuzz::run(&corpus, 120, 20261123, scratch.path()).await;
    println!("{report}");
    assert_eq!(report.answered, report.tried);
    assert_eq!(report.leftover_processes, 0, "{report}");
    assert_eq!(report.mutations.len(), 4, "{report}");
    assert!(
        !report.outcomes.contains_key("internal"),
        "no mutant may look like a fault of the worker: {report}"
    );
    assert!(
        report.outcomes.get("ok").is_some_and(|n| *n > 0),
        "{report}"
    );
}

#[test]
fn png_crc_of_a_real_chunk() {
    // IHDR of a 1x1 8-bit RGBA PNG; the mutants' inflated IHDRs must pass the CRC check.
    let ihdr = b"IHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";
    assert_eq!(fuzz::mutate::crc32(ihdr), 0x1F15_C489);
}

proptest! {
    /// Any bytes: the sniffer answers (never panics), and a known signature wins whatever
    /// follows it.
    #[test]
    fn sniffing_arbitrary_bytes(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = sniff::sniff(&tail);
        let jpeg = [&[0xFF, 0xD8, 0xFF][..], &tail].concat();
        prop_assert_eq!(sniff::sniff(&jpeg), Sniffed::Image(ImageFormat::Jpeg));
        let png = [&b"\x89PNG\r\n\x1a\n"[..], &tail].concat();
        prop_assert_eq!(sniff::sniff(&png), Sniffed::Image(ImageFormat::Png));
    }

    /// Any payload: the request parser answers, with a bounded reason when it refuses.
    #[test]
    fn parsing_arbitrary_payloads(payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let settings = Settings::load_from(None, Vec::new()).unwrap();
        if let Err(invalid) = media_worker::stages::validate::parse(Some(&payload), &settings) {
            prop_assert!(invalid.reason.chars().count() <= 301, "{}", invalid.reason);
        }
    }

    /// JSON objects with arbitrary values in the request's fields: never a panic, and an
    /// accepted request has ids and a key that passed the rules.
    #[test]
    fn parsing_arbitrary_requests(
        request_id in ".{0,300}",
        media_id in ".{0,80}",
        key in ".{0,300}",
        bucket in "[a-z0-9.-]{0,70}",
        version in 0u32..4,
    ) {
        let settings = Settings::load_from(None, Vec::new()).unwrap();
        let payload = serde_json::json!({
            "schema_version": version, "request_id": request_id, "media_id": media_id,
            "user_id": "u1", "source": {"bucket": bucket, "key": key}
        });
        let bytes = serde_json::to_vec(&payload).unwrap();
        if let Ok(req) = media_worker::stages::validate::parse(Some(&bytes), &settings) {
            let id_chars = req.request_id.chars().count();
            prop_assert!((1..=256).contains(&id_chars), "{:?}", req.request_id);
            prop_assert!(media_worker::stages::validate::is_valid_id(&req.media_id));
            prop_assert!(media_worker::stages::validate::is_valid_bucket(&req.source.bucket));
            prop_assert_eq!(req.source.key, key);
        }
    }
}
