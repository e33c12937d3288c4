//! Mutation fuzzing through the sandboxed path, as a standing check (`make fuzz N=2000`):
//! seeded mutants of every file of ../shared/corpus (bit flips, truncations, spliced chunks,
//! inflated header dimensions), each run by a sandbox child. Exits non-zero when a mutant goes
//! unanswered, is answered as a fault of the worker, or a process is left behind.
//!
//!   cargo bench --bench fuzz -- --count 500 --seed 1

use std::path::Path;

#[path = "../tests/common/fuzz.rs"]
mod fuzz;
mod util;

use util::arg;

fn main() {
    let count: usize = arg("--count", "500").parse().expect("--count N");
    let seed: u64 = arg("--seed", "1").parse().expect("--seed S");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let scratch = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let report = rt.block_on(fuzz::run(&corpus, count, seed, scratch.path()));
    println!(
        "fuzz: {count} mutants, seed {seed}, {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!("{report}");
    let internal = report.outcomes.get("internal").copied().unwrap_or(0);
    if report.answered != report.tried || report.leftover_processes > 0 || internal > 0 {
        eprintln!("fuzz: FAILED");
        std::process::exit(1);
    }
}
