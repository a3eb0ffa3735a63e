#!/usr/bin/env python3
"""Extract character vectors from an R lazy-load database as plain UTF-8 text.

An R package's data/ folder may hold a lazy-load database: two files sharing a
base name, Rdata.rdx (the index) and Rdata.rdb (the records).

  .rdx  gzip-compressed R serialization of a list with three named entries:
          variables   named list: object name -> integer vector (offset, length)
                      of its record in the .rdb
          references  named list (unused here)
          compressed  TRUE (zlib); 2 (bzip2) and 3 (xz) are refused below
  .rdb  concatenated records. A record at [offset, offset + length) is
          u32 big-endian  length of the uncompressed data
          zlib stream     an R serialization of the object

An R serialization ("XDR" format) is
  "X\\n"  i32 version (2 or 3)  i32 writer R version  i32 minimal R version
  [version 3: i32 n, n bytes: the native encoding name]
  one item, where every item opens with an i32 `flags` word:
    bits 0..7    the SEXP type (the table TYPE_* below)
    bit 8        is an object     bit 9  has attributes    bit 10  has a tag
    bits 12..27  "levels" (for a CHARSXP: its encoding, LATIN1 = 4, UTF8 = 8, ASCII = 64)
  All integers are big-endian i32, doubles big-endian IEEE 754.

Only the item types a data set of character vectors needs are decoded; any
other type stops with an error naming it.

Usage:
  rdata_text.py BASE --list                  print the object names in BASE.rdx
  rdata_text.py BASE OUT NAME [NAME ...]     write the named character vectors to
                                             OUT, one element per line, objects
                                             separated by one blank line

BASE is the path without the extension (…/data/Rdata). OUT is written through a
temporary file and renamed, so an interrupted run leaves no partial output.

Standard library only.
"""

import gzip
import os
import struct
import sys
import zlib

# SEXP types (R Internals, "Serialization formats").
TYPE_NIL = 0
TYPE_SYM = 1
TYPE_LIST = 2          # pairlist (attributes are pairlists)
TYPE_CHAR = 9          # one string (CHARSXP)
TYPE_LGL = 10
TYPE_INT = 13
TYPE_REAL = 14
TYPE_STR = 16          # character vector
TYPE_VEC = 19          # generic vector (list)
TYPE_REF = 255         # back-reference to an earlier symbol
TYPE_NILVALUE = 254
TYPE_GLOBALENV = 253
TYPE_EMPTYENV = 242
TYPE_BASEENV = 241
TYPE_MISSINGARG = 251
TYPE_BASENAMESPACE = 247

NA_INTEGER = -2**31
LATIN1_MASK = 1 << 2


class RdataError(Exception):
    pass


class Symbol(str):
    """An R symbol, kept apart from a plain string."""


class RList(list):
    """An R vector (generic, character, integer...) with its attributes."""

    def __init__(self, items=(), attributes=None):
        super().__init__(items)
        self.attributes = attributes or {}

    def names(self):
        return self.attributes.get("names")


class Reader:
    """Decodes one XDR R serialization held in `data`; `what` names it in errors."""

    def __init__(self, data, what):
        self.data = data
        self.pos = 0
        self.what = what
        self.refs = []  # symbols in the order they were read; REFSXP index i -> refs[i-1]

    def fail(self, message):
        raise RdataError(f"{self.what}: byte {self.pos}: {message}")

    def take(self, n):
        if self.pos + n > len(self.data):
            self.fail(f"truncated: need {n} bytes, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.i32()
        if n == -1:  # long vector: two i32 halves
            hi, lo = self.i32(), self.i32()
            n = (hi << 32) | (lo & 0xFFFFFFFF)
        if n < 0:
            self.fail(f"negative length {n}")
        return n

    def document(self):
        if self.take(2) != b"X\n":
            self.fail("not an XDR R serialization (expected 'X\\n')")
        version = self.i32()
        self.i32()  # R version that wrote it
        self.i32()  # oldest R version that can read it
        if version == 3:
            self.take(self.i32())  # native encoding name, e.g. "UTF-8"
        elif version != 2:
            self.fail(f"unsupported serialization version {version}")
        return self.item()

    def item(self):
        flags = self.i32()
        kind = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        levels = flags >> 12

        if kind in (TYPE_NILVALUE, TYPE_GLOBALENV, TYPE_EMPTYENV, TYPE_BASEENV,
                    TYPE_MISSINGARG, TYPE_BASENAMESPACE):
            return None
        if kind == TYPE_REF:
            index = flags >> 8
            if index == 0:
                index = self.i32()
            if not 1 <= index <= len(self.refs):
                self.fail(f"reference {index} to an unknown item")
            return self.refs[index - 1]
        if kind == TYPE_SYM:
            sym = Symbol(self.item())
            self.refs.append(sym)
            return sym
        if kind == TYPE_CHAR:
            n = self.i32()
            if n == -1:
                return None  # NA_character_
            raw = self.take(n)
            return raw.decode("latin-1" if levels & LATIN1_MASK else "utf-8")
        if kind == TYPE_LIST:
            # A pairlist: (attributes) (tag) car cdr, the cdr a pairlist or NULL.
            out = {}
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out[str(tag) if tag is not None else str(len(out))] = self.item()
                flags = self.i32()
                kind = flags & 0xFF
                if kind == TYPE_NILVALUE:
                    return out
                if kind != TYPE_LIST:
                    self.fail(f"pairlist tail of type {kind} is not supported")
                has_attr = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
        if kind in (TYPE_LGL, TYPE_INT):
            n = self.length()
            values = struct.unpack(f">{n}i", self.take(4 * n))
            items = [None if v == NA_INTEGER else v for v in values]
        elif kind == TYPE_REAL:
            n = self.length()
            items = list(struct.unpack(f">{n}d", self.take(8 * n)))
        elif kind == TYPE_STR:
            n = self.length()
            items = [self.item() for _ in range(n)]
        elif kind == TYPE_VEC:
            n = self.length()
            items = [self.item() for _ in range(n)]
        else:
            self.fail(f"R item type {kind} is not supported")
        attributes = self.item() if has_attr else None
        return RList(items, attributes)


def named(value, what):
    """A named R list as a Python dict (name -> value)."""
    if not isinstance(value, RList) or value.names() is None:
        raise RdataError(f"{what}: expected a named list")
    return dict(zip(value.names(), value))


def read_index(base):
    path = base + ".rdx"
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RdataError(f"{path}: cannot read the gzip'd index: {e}") from e
    index = named(Reader(data, path).document(), path)
    if "variables" not in index:
        raise RdataError(f"{path}: the index has no 'variables' entry")
    compressed = index.get("compressed", RList([True]))
    if list(compressed) not in ([True], [1]):
        raise RdataError(f"{path}: records compressed with method {list(compressed)}; "
                         "only zlib (compressed = TRUE) is supported")
    return {name: tuple(pos) for name, pos in named(index["variables"], path).items()}


def read_object(base, rdb_bytes, name, position):
    path = base + ".rdb"
    offset, length = position
    record = rdb_bytes[offset:offset + length]
    if len(record) != length or length < 4:
        raise RdataError(f"{path}: record '{name}' at [{offset}, {offset + length}) "
                         f"lies outside the file ({len(rdb_bytes)} bytes)")
    expected = struct.unpack(">I", record[:4])[0]
    try:
        data = zlib.decompress(record[4:])
    except zlib.error as e:
        raise RdataError(f"{path}: record '{name}': bad zlib stream: {e}") from e
    if len(data) != expected:
        raise RdataError(f"{path}: record '{name}': {len(data)} bytes after inflating, "
                         f"the record header says {expected}")
    return Reader(data, f"{path} record '{name}'").document()


def write_text(out_path, base, names):
    variables = read_index(base)
    missing = [n for n in names if n not in variables]
    if missing:
        raise RdataError(f"{base}.rdx: no object named {', '.join(missing)} "
                         f"(present: {', '.join(sorted(variables))})")
    with open(base + ".rdb", "rb") as f:
        rdb_bytes = f.read()
    blocks = []
    for name in names:
        value = read_object(base, rdb_bytes, name, variables[name])
        if not isinstance(value, RList) or not all(v is None or isinstance(v, str) for v in value):
            raise RdataError(f"{base}.rdb: object '{name}' is not a character vector")
        blocks.append("\n".join("" if v is None else v for v in value))
    text = "\n\n".join(blocks) + "\n"
    tmp = out_path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, out_path)


def main(argv):
    if len(argv) == 3 and argv[2] == "--list":
        for name in read_index(argv[1]):
            print(name)
        return 0
    if len(argv) < 4:
        print(__doc__.split("Usage:")[1].split("BASE is")[0].rstrip(), file=sys.stderr)
        return 2
    write_text(argv[2], argv[1], argv[3:])
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (RdataError, OSError) as e:
        print(f"rdata_text.py: {e}", file=sys.stderr)
        sys.exit(1)
