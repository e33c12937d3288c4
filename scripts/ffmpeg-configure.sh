#!/usr/bin/env bash
# The component flags of ffmpeg's ./configure from config/ffmpeg-components (the inputs the
# worker takes and what its runs use), run in ffmpeg's source tree (the Dockerfile's ffmpeg
# stage):
#
#   scripts/ffmpeg-configure.sh LIST      prints --enable-decoder=... --enable-parser=... ...
#
# Each container's demuxer; each listed codec's decoder (the codec's name unless a `codec` line
# names another) and its parser (named by a `codec` line, else the codec's own where ffmpeg has
# one); each `uses` and `implies` line's components. Fails on a name that ./configure does not
# know (a typo, or a component this ffmpeg lacks): configure itself would drop it silently.
set -euo pipefail
list=$1
declare -A known family decoder parser
for kind in decoder parser demuxer muxer encoder filter bsf protocol; do
  for name in $(./configure --list-${kind}s); do known[$kind:$name]=1; done
done

# The lines, comments and blank lines dropped.
lines=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$list")
while read -r kind name rest; do
  case $kind in
    family) family[$name]=$rest ;;
    codec)
      for kv in $rest; do
        case $kv in
          decoder=*) decoder[$name]=${kv#decoder=} ;;
          parser=*) parser[$name]=${kv#parser=} ;;
          *) echo "ffmpeg-configure: codec $name: $kv?" >&2; exit 1 ;;
        esac
      done ;;
  esac
done <<<"$lines"

flags=()
enable() { # KIND NAME
  if [ -z "${known[$1:$2]:-}" ]; then
    echo "ffmpeg-configure: ffmpeg has no $1 named $2" >&2; exit 1
  fi
  flags+=("--enable-$1=$2")
}
while read -r kind a rest; do
  case $kind in
    container)
      # The list names a demuxer as `-f` does; ./configure names MPEG-PS's `mpegps`.
      case $a in mpeg) enable demuxer mpegps ;; *) enable demuxer "$a" ;; esac
      for item in $rest; do
        for codec in ${family[$item]:-$item}; do
          enable decoder "${decoder[$codec]:-$codec}"
          if [ -n "${parser[$codec]:-}" ]; then enable parser "${parser[$codec]}"
          elif [ -n "${known[parser:$codec]:-}" ]; then enable parser "$codec"; fi
        done
      done ;;
    uses | implies) for name in $rest; do enable "$a" "$name"; done ;;
    family | codec) ;;
    *) echo "ffmpeg-configure: $kind?" >&2; exit 1 ;;
  esac
done <<<"$lines"
printf '%s\n' "${flags[@]}" | sort -u
