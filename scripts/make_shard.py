#!/usr/bin/env python3
"""make_shard.py: write an llm.c-format token shard (what --data reads).

A shard is a header of 256 little-endian int32 (magic 20240520, version 1,
token count, the rest zero) followed by the tokens as little-endian uint16.

  make_shard.py OUT.bin --text FILE          one token per byte (vocab 256); FILE '-' = stdin
  make_shard.py OUT.bin --tokens 5 17 300    the given token ids
  make_shard.py OUT.bin --tokens-file FILE   ids separated by spaces, commas or newlines

--magic, --version and --count override the header fields, to make the
broken shards that the error tests need. Put several shards in a folder to
train on all of them; names containing "val" become the validation split.
"""
import argparse
import re
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def read_tokens(args):
    if args.text is not None:
        if args.text == "-":
            return list(sys.stdin.buffer.read())
        with open(args.text, "rb") as f:
            return list(f.read())
    if args.tokens_file is not None:
        with open(args.tokens_file) as f:
            words = [w for w in re.split(r"[\s,]+", f.read()) if w]
        return [int(w) for w in words]
    return args.tokens


def main():
    p = argparse.ArgumentParser(description="Write an llm.c-format uint16 token shard.")
    p.add_argument("out", help="shard file to write (e.g. data/train_000.bin)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="FILE", help="byte-tokenize a text file ('-' = stdin)")
    src.add_argument("--tokens", metavar="ID", type=int, nargs="+", help="token ids")
    src.add_argument("--tokens-file", metavar="FILE", help="file of token ids")
    p.add_argument("--magic", type=int, default=MAGIC, help=argparse.SUPPRESS)
    p.add_argument("--version", type=int, default=VERSION, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    try:
        tokens = read_tokens(args)
    except (OSError, ValueError) as e:
        sys.exit(f"make_shard.py: error: {e}")
    bad = [t for t in tokens if not 0 <= t < 65536]
    if bad:
        sys.exit(f"make_shard.py: error: token {bad[0]} does not fit in uint16 (0..65535)")

    header = [0] * HEADER_INTS
    header[0], header[1] = args.magic, args.version
    header[2] = len(tokens) if args.count is None else args.count
    with open(args.out, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    print(f"wrote {args.out}: {len(tokens)} tokens, max id {max(tokens, default=0)}")


if __name__ == "__main__":
    main()
