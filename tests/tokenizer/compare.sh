#!/usr/bin/env bash
# headroom's tokenizer.json against the reference (Hugging Face tokenizers, the
# npm package, run by reference.js) on the same files:
#
#   compare.sh TOKENIZE NODE_PATH TOKENIZER_JSON SAMPLE TEXT...
#
# TOKENIZE is examples/tokenize; NODE_PATH the node_modules folder holding the
# reference; SAMPLE a short multilingual text, encoded with and without special
# tokens and decoded; each TEXT (a corpus) encoded; "every-code-point" as a
# TEXT stands for the text tests/tokenizer/every_code_point.py writes, encoded
# and decoded. Ids must be equal, decoded text equal byte for byte, and decoding
# our ids must give the reference's text back. Exit 1 on the first difference.
set -euo pipefail
tool="$1" node_path="$2" json="$3" sample="$4"
shift 4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export NODE_PATH="$node_path"

reference() { node "$here/reference.js" "$json" "$@"; }

same() {  # same WHAT OURS THEIRS
  if ! cmp -s "$2" "$3"; then
    echo "DIFFERENT: $1" >&2
    diff <(head -c 2000000 "$3") <(head -c 2000000 "$2") | head -n 12 >&2 || true
    exit 1
  fi
  echo "same: $1 ($(wc -l <"$2") lines)"
}

check() {  # check TEXT MODES...
  local text="$1" name
  name="$(basename "$text")"
  shift
  for mode in "$@"; do
    case "$mode" in
      encode)
        reference "$text" encode >"$tmp/ref.ids"
        "$tool" "$json" "$text" >"$tmp/ours.ids"
        same "encode $name" "$tmp/ours.ids" "$tmp/ref.ids" ;;
      encode-special)
        reference "$text" encode-special >"$tmp/ref.special.ids"
        "$tool" "$json" "$text" --special >"$tmp/ours.special.ids"
        same "encode with special tokens $name" "$tmp/ours.special.ids" "$tmp/ref.special.ids" ;;
      decode)
        reference "$tmp/ref.ids" decode >"$tmp/ref.txt"
        "$tool" "$json" "$tmp/ref.ids" --decode >"$tmp/ours.txt"
        same "decode $name" "$tmp/ours.txt" "$tmp/ref.txt"
        "$tool" "$json" "$tmp/ours.ids" --decode >"$tmp/ours.own.txt"
        same "decode of our own ids $name" "$tmp/ours.own.txt" "$tmp/ref.txt" ;;
    esac
  done
}

check "$sample" encode encode-special decode
for text in "$@"; do
  if [[ "$text" == every-code-point ]]; then
    /usr/bin/python3 "$here/every_code_point.py" "$tmp/every-code-point.txt"
    check "$tmp/every-code-point.txt" encode decode
  else
    check "$text" encode
  fi
done
