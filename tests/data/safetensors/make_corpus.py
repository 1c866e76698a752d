#!/usr/bin/env python3
"""Generate the malformed safetensors corpus (run once; the outputs are committed).

Each case is one file (or one folder for sharded cases) breaking exactly one rule of the
format. README.md lists every case with the status and message substring test_store.c expects.
Usage: python3 make_corpus.py  (writes next to this script)
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st_bytes(header, data=b"", pad=True, raw_header=None, length=None):
    """A safetensors file: 8-byte LE header length, header JSON (space padded to 8), data."""
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


def write(name, content):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(content)


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def main():
    # --- valid reference file, made independently of ferry's writer ----------------------
    write("valid_small.safetensors", st_bytes(
        {"__metadata__": {"format": "pt", "note": "hand made"},
         "w": t("F32", [2, 2], 0, 16), "b": t("BF16", [3], 16, 22), "s": t("I8", [], 22, 23),
         "empty": t("F16", [0, 4], 23, 23), "u": t("U8", [1], 23, 24)},
        bytes(range(24))))

    # --- malformed single files -------------------------------------------------------------
    write("empty.safetensors", b"")
    write("truncated_length.safetensors", b"\x10\x00\x00\x00\x00")
    write("header_len_past_eof.safetensors", struct.pack("<Q", 1000) + b"{}" + b" " * 18)
    write("header_len_2pow63.safetensors", struct.pack("<Q", 1 << 63) + b"{}      ")
    write("header_len_over_limit.safetensors", struct.pack("<Q", 100 * 1024 * 1024 + 1) + b"{}      ")
    write("invalid_json.safetensors", st_bytes(None, raw_header=b'{"a": {"dtype": "F32",'))
    write("trailing_json_garbage.safetensors", st_bytes(None, raw_header=b'{} x'))
    write("header_not_object.safetensors", st_bytes([1, 2, 3]))
    write("unknown_dtype.safetensors", st_bytes({"a": t("F31", [1], 0, 4)}, b"\0" * 4))
    write("dtype_short_name.safetensors", st_bytes({"a": t("fp32", [1], 0, 4)}, b"\0" * 4))
    write("missing_dtype.safetensors", st_bytes({"a": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4))
    write("offsets_past_eof.safetensors", st_bytes({"a": t("F32", [4], 0, 16)}, b"\0" * 8))
    write("begin_after_end.safetensors", st_bytes({"a": t("F32", [1], 8, 4)}, b"\0" * 8))
    write("offsets_wrong_arity.safetensors",
          st_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4))
    write("overlap.safetensors", st_bytes({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, b"\0" * 12))
    write("hole.safetensors", st_bytes({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, b"\0" * 12))
    write("trailing_bytes.safetensors", st_bytes({"a": t("F32", [1], 0, 4)}, b"\0" * 8))
    write("shape_size_mismatch.safetensors", st_bytes({"a": t("F32", [3], 0, 8)}, b"\0" * 8))
    write("negative_shape.safetensors", st_bytes({"a": t("F32", [-1], 0, 4)}, b"\0" * 4))
    write("non_integer_shape.safetensors", st_bytes({"a": t("F32", [1.5], 0, 4)}, b"\0" * 4))
    write("shape_overflow.safetensors", st_bytes({"a": t("F32", [2 ** 52, 2 ** 52], 0, 4)}, b"\0" * 4))
    write("too_many_dims.safetensors", st_bytes({"a": t("F32", [1] * 9, 0, 4)}, b"\0" * 4))
    write("missing_data_offsets.safetensors", st_bytes({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4))
    write("duplicate_names.safetensors", st_bytes(None, raw_header=(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'), data=b"\0" * 8))
    write("name_control_char.safetensors", st_bytes({"a\nb": t("F32", [1], 0, 4)}, b"\0" * 4))
    write("name_nul_escape.safetensors", st_bytes(None, raw_header=(
        b'{"a\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'), data=b"\0"))
    write("name_escaped_backslash_ok.safetensors", st_bytes(None, raw_header=(
        b'{"a\\\\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'), data=b"\0"))
    write("empty_name.safetensors", st_bytes({"": t("F32", [1], 0, 4)}, b"\0" * 4))
    write("tensor_not_object.safetensors", st_bytes({"a": [1, 2]}))
    write("metadata_non_string.safetensors",
          st_bytes({"__metadata__": {"format": 1}, "a": t("F32", [1], 0, 4)}, b"\0" * 4))
    write("metadata_not_object.safetensors",
          st_bytes({"__metadata__": "pt", "a": t("F32", [1], 0, 4)}, b"\0" * 4))

    # --- sharded sets: one folder per case ----------------------------------------------------
    def shard_case(folder, weight_map, shards):
        d = os.path.join(HERE, folder)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 8}, "weight_map": weight_map}, f, indent=1)
        for name, content in shards.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(content)

    s1 = "model-00001-of-00002.safetensors"
    s2 = "model-00002-of-00002.safetensors"
    one_a = st_bytes({"a": t("F32", [1], 0, 4)}, b"\1\0\0\0")
    one_b = st_bytes({"b": t("F32", [1], 0, 4)}, b"\2\0\0\0")
    shard_case("sharded_valid", {"a": s1, "b": s2}, {s1: one_a, s2: one_b})
    shard_case("sharded_missing_shard", {"a": s1, "b": s2}, {s1: one_a})
    shard_case("sharded_tensor_not_in_shard", {"a": s1, "b": s1}, {s1: one_a})
    shard_case("sharded_tensor_not_in_map", {"a": s1}, {s1: st_bytes(
        {"a": t("F32", [1], 0, 4), "c": t("F32", [1], 4, 8)}, b"\0" * 8)})
    shard_case("sharded_wrong_shard", {"a": s2, "b": s1}, {s1: one_a, s2: one_b})
    shard_case("sharded_path_traversal", {"a": "../valid_small.safetensors"}, {})
    shard_case("sharded_dotdot", {"a": "..valid_small.safetensors"}, {})
    shard_case("sharded_duplicate_tensor", {"a": s1, "b": s2}, {s1: one_a, s2: st_bytes(
        {"a": t("F32", [1], 0, 4), "b": t("F32", [1], 4, 8)}, b"\0" * 8)})


if __name__ == "__main__":
    main()
