"""Writes a UTF-8 text holding Unicode scalar values in contexts that show how
a tokenizer classifies each: next to a letter, a digit, a space, itself, an
apostrophe and a newline ("a{c}1 {c}{c}'{c}\n" per code point).

    python3 every_code_point.py OUT

Every code point assigned in this Python's Unicode database (unicodedata;
14.0 on Debian 12, the version of PCRE2 10.42's tables there), and every 97th
of the private-use planes 15-16. Code points assigned in later versions are
left out: their classes are the tables' version's, which need not be the
reference's.
"""
import sys
import unicodedata

def code_points():
    for c in range(0xF0000):
        if unicodedata.category(chr(c)) not in ("Cn", "Cs"):
            yield c
    yield from range(0xF0000, 0x110000, 97)

def main():
    out = sys.argv[1]
    with open(out, "w", encoding="utf-8", newline="") as f:
        for c in code_points():
            ch = chr(c)
            f.write(f"a{ch}1 {ch}{ch}'{ch}\n")

main()
