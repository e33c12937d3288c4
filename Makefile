# media-worker. `make demo` and `make test` install what they need on Debian 12.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
DIR ?= ../shared/corpus

.PHONY: setup setup-test setup-demo build release demo test test-fleet test-k8s lint audit advisory-db deploy-check image test-images sbom bench sharp bench-quality fuzz eval-faces schemas clean

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

setup-demo:
	@scripts/setup.sh --demo

build: setup
	cargo build

release: setup
	cargo build --release

## The main job on an embedded default: in-process Kafka (MockCluster) + local store over DIR,
## with the `showcase` profile; writes a gallery page (index.html) of what it made.
demo: setup-demo release
	RUST_LOG=warn target/release/media-worker demo $(DIR)

## The tests' build: the release profile, so that the shipped binary and the tests share one
## build of the dependencies (the dev-dependencies turn on no feature of theirs: Cargo.toml);
## the worker's own code unoptimised, as in a dev build (a binary per test file: at opt-level 1
## they took 284 s to build here, unoptimised 85 s); the test-only feature `attack-probe`
## (tests/confinement.rs plays a compromised decoder with it). Benchmarks (`cargo bench`) build
## with full optimisation on the same dependencies.
TEST_BUILD = --release --config 'profile.release.package.media-worker.opt-level=0' --features attack-probe

## Everything: formatting, lints, unit tests, and end-to-end tests against Apache Kafka + s3s-fs
## (on free loopback ports: scripts/kafka.sh), under cargo-nextest: a process and a time limit
## per test (.config/nextest.toml). The fleet scenarios run here under the default group
## protocol (consumer); `make test-fleet` runs them under both. Benchmarks are compiled by
## `lint` (clippy --all-targets) and run by `make bench`. Tests are built as TEST_BUILD says.
## The images are built first (`test-images`): tests/container.rs runs them.
test: setup-test lint deploy-check test-images
	cargo nextest run $(TEST_BUILD) --lib --bins --tests \
		-E 'not (binary(fleet) and test(/^classic::/)) and not binary(k8s)'

## Fleet delivery under faults: 3 worker processes, a 3-node Kafka cluster, a 4-partition topic,
## 300 requests per scenario (kill -9 a worker, rolling restart, kill -9 the leading broker, a
## broker down 30 s, S3 down 20 s, scale 1 -> 3 -> 1), each under both group protocols. `make
## test` runs the same scenarios with 60 requests each.
test-fleet: setup-test
	FLEET_REQUESTS=300 cargo nextest run --profile fleet $(TEST_BUILD) --test fleet --no-capture

## deploy/k8s in a real Kubernetes (tests/k8s.rs): a one-node cluster on loopback, built from
## the Go module proxy by `scripts/setup.sh --k8s` (scripts/k8s.sh; once, about 12 min on 2
## cores) and started by nextest, the shipped image and the ClamAV sidecars' image loaded into
## its containerd, deploy/k8s applied through overlays/local-cluster. Not in `make test`: the
## cluster's build does not fit CI's 90 minutes beside it (docs/operations.md, "The cluster
## tests").
test-k8s:
	scripts/setup.sh --k8s
	cargo build --release --locked --bin media-worker
	scripts/image.sh target/release/media-worker media-worker:k8s
	DOCKER_BUILDKIT=1 $${DOCKER:-/usr/bin/docker} build --quiet --network host -t media-worker-clamav:k8s \
		-f deploy/k8s/overlays/local-cluster/clamav/Dockerfile.clamav deploy/k8s/overlays/local-cluster/clamav >/dev/null
	cargo nextest run --profile k8s $(TEST_BUILD) --test k8s --no-capture

## The container and Kubernetes files: Dockerfile lint, the shipped image (its build checks that
## it holds every library its programs need and no attack probe: scripts/image.sh), every
## kustomization rendered and validated against the release binary the image holds.
deploy-check: image
	hadolint --no-color Dockerfile
	python3 scripts/validate-k8s.py target/release/media-worker

## Supply chain: advisories, licences, banned and duplicate crates, sources (deny.toml), offline:
## the RustSec database from ../shared/advisory-db.bundle (`advisory-db`), the crates fetched
## first; formatting; no import cycle between files or folders of src/ (tests/architecture.rs);
## clippy, with and without the test-only feature. Clippy checks the release profile: it then
## reuses the build scripts' runs of the tests' build (OpenCV's bindings, librdkafka, jpegli)
## instead of making them again unoptimised (5.5 min of a fresh `make test`).
lint: setup-test advisory-db
	cargo fetch --locked --quiet
	cargo deny --offline check advisories bans licenses sources
	cargo fmt --all -- --check
	cargo test $(TEST_BUILD) --test architecture
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --features attack-probe -- -D warnings

## The advisories against the newest RustSec database, fetched from GitHub (where it is reached).
audit: setup-test
	cargo deny check advisories

## The RustSec database of ../shared/advisory-db.bundle, cloned where deny.toml's db-path expects
## the default database URL's: cloned again unless the clone holds the bundle's commit (a newer
## bundle; `make audit` may have fetched past it).
ADVISORY_BUNDLE ?= ../shared/advisory-db.bundle
advisory-db:
	@db=$(HOME)/.cache/media-worker/advisory-dbs/advisory-db-3157b0e258782691; \
	head=$$(git bundle list-heads $(ADVISORY_BUNDLE) HEAD | cut -d' ' -f1); \
	git -C $$db merge-base --is-ancestor $$head HEAD 2>/dev/null || \
	  { rm -rf $$db && git clone --quiet $(ADVISORY_BUNDLE) $$db; }

## The runtime image `media-worker:latest` (what deploy/k8s runs), built by this machine's Docker
## Engine (setup-test installs and starts it): the release build made here (the build the benches
## measure: `cargo bench` shares its dependencies), with ffmpeg, ffprobe and tini and the libraries
## they load, on no base (scripts/image-root.sh; docs/operations.md, "The image"). Labelled
## media-worker.profile=release and with the source revision, as media_worker_build_info says,
## and with the Debian snapshot its packages are from (media-worker.debian-snapshot: the archive's
## state, read with apt at each build, keys the package stage, so a build takes Debian's current
## security updates). The stages that need no binary (mostly downloads and package installs, the
## ffmpeg build of config/ffmpeg-components) build beside it.
image: setup-test
	@mkdir -p target; scripts/image.sh --stages >target/image-stages.log 2>&1 & stages=$$!; \
	cargo build --release --locked --bin media-worker; built=$$?; \
	wait $$stages || { cat target/image-stages.log; exit 1; }; exit $$built
	scripts/image.sh target/release/media-worker media-worker:latest

## For tests/container.rs only: `media-worker:attack-probe`, the same runtime with the binary the
## tests are built with (TEST_BUILD: the build nextest then finds done; it replaces the shipped
## binary in target/release, after `image` and `deploy-check` have used it). The shipped image is
## checked to lack the probe.
test-images: image
	cargo test $(TEST_BUILD) --no-run --lib --bins --tests
	scripts/image.sh target/release/media-worker media-worker:attack-probe --probe

## An SBOM of what ships, target/sbom/media-worker.cdx.json (CycloneDX 1.5): the binary's crates
## as built (shipped features, no build-time crates; cargo-cyclonedx, which `setup.sh --sbom`
## installs) and the Debian packages whose files media-worker:latest holds (its
## /var/lib/dpkg/status.d, written with the files by scripts/image-root.sh).
sbom: image
	@scripts/setup.sh --sbom
	mkdir -p target/sbom
	cargo cyclonedx --format json --spec-version 1.5 --no-build-deps \
		--target $$(rustc -vV | sed -n 's/^host: //p') --override-filename media-worker-crates
	mv media-worker-crates.json target/sbom/
	python3 scripts/sbom.py target/sbom/media-worker-crates.json media-worker:latest \
		> target/sbom/media-worker.cdx.json
	@echo "sbom: target/sbom/media-worker.cdx.json"

bench: setup-test sharp
	cargo bench --bench throughput -- --sharp $(TOOLS)/sharp --photos 6 --rounds 6
	cargo bench --bench pipeline -- --profile default --pool 2 --rounds 10 --analysis compare
	cargo bench --bench pipeline -- --profile default --pool 2 --rounds 6 --isolation compare
	cargo bench --bench pipeline -- --profile variants --pool 2 --rounds 6 --isolation compare
	cargo bench --bench pipeline -- --profile default --pool 2 --rounds 3 --isolation process
	cargo bench --bench pipeline -- --profile default --pool 2 --rounds 3 --isolation process --pss on
	cargo bench --bench pipeline -- --profile default --pool 2 --rounds 3 --isolation inline
	cargo bench --bench pipeline -- --profile auto --pool 2 --rounds 3 --isolation process
	cargo bench --bench pipeline -- --profile picture --pool 2 --rounds 2 --isolation process
	cargo bench --bench video -- --rounds 3
	cargo bench --bench streaming -- --rounds 3
	cargo bench --bench units -- --minutes 10
	cargo bench --bench units -- --minutes 10 --keyframe-secs 1 --paired
	cargo bench --bench fairness -- --workers 2 --images 20
	cargo bench --bench dispatch -- --messages 20000 --ids 50
	cargo bench --bench dispatch -- --messages 20000 --ids 50 --broker kafka
	cargo bench --bench scratch_meter -- --hours 2 --seconds 5
	cargo bench --bench api_split -- --rounds 5 --requests 40 --clients 3

## Bytes at equal quality against sharp (npm, installed here into a cache, never a runtime
## dependency; `make bench` also races it, and a plain libvips loop, against the whole worker),
## fixed and auto quality (the `picture` profile: AVIF, WebP, JPEG), sharp's JPEG at its default
## and with mozjpeg, its AVIF at its defaults; scored with dssim (cargo-installed into the same
## cache) and an SSIMULACRA2 written apart from the worker's (ssimu2-lite); issue 57's goals.
TOOLS ?= $(HOME)/.cache/media-worker
SHARP_VERSION ?= 0.35.5
DSSIM_VERSION ?= 3.5.1
sharp:
	@test -d $(TOOLS)/sharp/node_modules/sharp || npm install --prefix $(TOOLS)/sharp --no-audit --no-fund sharp@$(SHARP_VERSION)

bench-quality: setup-test sharp
	@test -x $(TOOLS)/tools/bin/dssim || cargo install --locked --root $(TOOLS)/tools dssim --version $(DSSIM_VERSION)
	cargo bench --bench quality -- --sharp $(TOOLS)/sharp --dssim $(TOOLS)/tools/bin/dssim
	# AVIF at sharp's mean: its default scores under "high".
	cargo bench --bench quality -- --sharp $(TOOLS)/sharp --dssim $(TOOLS)/tools/bin/dssim \
		--formats avif --avif-target 56

## Mutation fuzzing through the sandboxed path: N seeded mutants of ../shared/corpus (bit flips,
## truncations, splices, inflated header dimensions); fails on an unanswered mutant, a worker
## fault or a leftover process. `make test` runs a fixed sample of 120 (tests/fuzz.rs).
N ?= 500
SEED ?= 1
fuzz: setup-test
	cargo bench --bench fuzz -- --count $(N) --seed $(SEED)

## Face detection vs the counts in ../shared/corpus/MANIFEST.tsv.
eval-faces: release
	RUST_LOG=warn target/release/media-worker eval-faces $(DIR)

schemas: build
	target/debug/media-worker schemas --out schemas

clean:
	cargo clean
