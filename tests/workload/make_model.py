#!/usr/bin/env python3
"""Generate a deterministic tiny ONNX token-classification model for OpenMed.

Run through tests/workload/make-model, which supplies the workload's
Python. The model is written into a Hugging Face hub cache layout so that
``openmed`` (backend="onnx", local_only=true) can load it fully offline:

    <cache>/models--<Org>--<name>/refs/main                  (40-hex commit)
    <cache>/models--<Org>--<name>/snapshots/<commit>/model.onnx
    <cache>/models--<Org>--<name>/snapshots/<commit>/config.json
    <cache>/models--<Org>--<name>/snapshots/<commit>/tokenizer.json
    <cache>/models--<Org>--<name>/snapshots/<commit>/tokenizer_config.json
    <cache>/models--<Org>--<name>/snapshots/<commit>/special_tokens_map.json

Graph (opset 17):  logits[b,s,L] = Gather(table[V,L], input_ids) * attention_mask
so every vocabulary word maps deterministically to one BIO label row.  Words
not in the vocabulary become [UNK], which maps to "O".

Options:
  --labels NAME,DATE,LOCATION,PHONE   entity types present in id2label
  --misses LABEL                      label stays in id2label but its words -> O
  --fail-requests                     loads fine; every inference run raises an
                                      ONNX Runtime error (Gather index out of
                                      bounds) when seq_len > --fail-above-tokens
                                      (default 0 => every run fails)
  --size-mb N                         pad model.onnx with an N MiB initializer
                                      (deterministic bytes); unused by default,
                                      --pad-resident keeps it in session memory

Same arguments => byte-identical files and the same commit hash.
Needs: numpy, onnx, tokenizers.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

GENERATOR_VERSION = "1"
OPSET = 17
IR_VERSION = 8
LOGIT_HIGH = 8.0

GIVEN_NAMES = [
    "john", "mary", "james", "patricia", "robert", "jennifer", "michael", "linda",
    "william", "elizabeth", "david", "barbara", "richard", "susan", "joseph",
    "jessica", "thomas", "sarah", "charles", "karen", "maria", "jose", "ahmed",
    "fatima", "wei", "yuki", "olga", "pierre", "giulia", "hans", "aisha", "carlos",
    "emma", "liam", "olivia", "noah", "sophia", "lucas", "mia", "ethan",
]
SURNAMES = [
    "smith", "johnson", "williams", "brown", "jones", "garcia", "miller", "davis",
    "rodriguez", "martinez", "hernandez", "lopez", "gonzalez", "wilson", "anderson",
    "taylor", "moore", "jackson", "martin", "lee", "thompson", "white", "harris",
    "clark", "lewis", "walker", "hall", "young", "king", "wright", "khan", "chen",
    "tanaka", "ivanova", "dubois", "rossi", "schmidt", "okafor", "silva", "nguyen",
]
# Multi-word cities: first word B-LOCATION, following words I-LOCATION.
CITIES = [
    "boston", "chicago", "seattle", "denver", "austin", "houston", "phoenix",
    "dallas", "miami", "atlanta", "portland", "detroit", "baltimore", "nashville",
    "memphis", "cleveland", "pittsburgh", "springfield", "london", "paris",
    "berlin", "madrid", "rome", "toronto", "sydney", "tokyo", "cairo", "lagos",
    "new york", "los angeles", "san francisco", "san diego", "las vegas",
    "salt lake city", "new orleans",
]
AREA_CODES = ["202", "212", "312", "415", "617", "718"]
ORG_WORDS = ["mercy", "general", "hospital", "clinic", "medical", "center"]

# Label order (after "O") when all are requested.
KNOWN_LABELS = ("NAME", "DATE", "LOCATION", "PHONE", "EMAIL", "ID")


def _dates() -> list[str]:
    out = []
    day = _dt.date(2023, 1, 1)
    end = _dt.date(2025, 12, 31)
    while day <= end:
        out.append(day.isoformat())                      # 2024-03-15
        out.append(day.strftime("%m/%d/%Y"))             # 03/15/2024
        day += _dt.timedelta(days=1)
    # Birth-date style years-in-the-past ISO dates (1st and 15th of each month).
    for year in range(1940, 2023):
        for month in range(1, 13):
            for dom in (1, 15):
                out.append(_dt.date(year, month, dom).isoformat())
    return out


def _phones() -> list[str]:
    out = []
    for line in range(100, 200):
        suffix = f"555-{line:04d}"
        out.append(suffix)                               # 555-0142
        for area in AREA_CODES:
            out.append(f"{area}-{suffix}")               # 617-555-0142
    return out


def _emails() -> list[str]:
    return [f"{g}.{s}@example.com" for g in GIVEN_NAMES for s in SURNAMES[:10]]


def _ids() -> list[str]:
    return [f"mrn-{n:06d}" for n in range(100, 1100)]


def lexicon() -> list[tuple[str, str, str]]:
    """Return (word, prefix, label) entries in a fixed order."""
    entries: list[tuple[str, str, str]] = []
    entries += [(w, "B", "NAME") for w in GIVEN_NAMES]
    entries += [(w, "I", "NAME") for w in SURNAMES]
    for city in CITIES:
        parts = city.split()
        entries.append((parts[0], "B", "LOCATION"))
        entries += [(p, "I", "LOCATION") for p in parts[1:]]
    entries += [(w, "B", "DATE") for w in _dates()]
    entries += [(w, "B", "PHONE") for w in _phones()]
    entries += [(w, "B", "EMAIL") for w in _emails()]
    entries += [(w, "B", "ID") for w in _ids()]
    entries += [(w, "", "O") for w in ORG_WORDS]
    return entries


def build_vocab(entries):
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    word_label: dict[str, tuple[str, str]] = {}
    for word, prefix, label in entries:
        if word in vocab:
            # First assignment wins (e.g. "san" is B-LOCATION for every San ...).
            continue
        vocab[word] = len(vocab)
        word_label[word] = (prefix, label)
    return vocab, word_label


def build_tokenizer(vocab: dict[str, int], max_len: int) -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            # Isolate punctuation; a trailing '.' is split off ("Boston." ->
            # "boston" "."), inner dots/dashes/slashes stay (emails, dates).
            pre_tokenizers.Split(Regex(r'[,;:!?()\[\]"]|\.$'), behavior="isolated"),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.enable_truncation(max_length=max_len)
    return tok


def build_graph(table: np.ndarray, *, fail: bool, fail_above: int, pad_bytes: int,
                pad_resident: bool, repo: str) -> onnx.ModelProto:
    nodes = []
    inits = [numpy_helper.from_array(table, name="label_table")]
    nodes.append(helper.make_node("Gather", ["label_table", "input_ids"], ["emb"], axis=0))
    nodes.append(helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT))
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), name="last_axis"))
    nodes.append(helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_u"]))
    out_name = "logits" if not fail else "masked"
    nodes.append(helper.make_node("Mul", ["emb", "mask_u"], [out_name]))
    if fail:
        # seq_len > fail_above  ->  Gather index 1_000_000 into a 1-row table:
        # ONNX Runtime raises INVALID_ARGUMENT at run time.  Loading succeeds.
        inits += [
            numpy_helper.from_array(np.array(1, dtype=np.int64), name="axis1"),
            numpy_helper.from_array(np.array(fail_above, dtype=np.int64), name="fail_above"),
            numpy_helper.from_array(np.array(1_000_000, dtype=np.int64), name="big"),
            numpy_helper.from_array(np.zeros([1], dtype=np.float32), name="guard_table"),
        ]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
            helper.make_node("Gather", ["ids_shape", "axis1"], ["seq_len"], axis=0),
            helper.make_node("Greater", ["seq_len", "fail_above"], ["too_long"]),
            helper.make_node("Cast", ["too_long"], ["too_long_i"], to=TensorProto.INT64),
            helper.make_node("Mul", ["too_long_i", "big"], ["guard_idx"]),
            helper.make_node("Gather", ["guard_table", "guard_idx"], ["guard"], axis=0),
            helper.make_node("Add", ["masked", "guard"], ["logits"]),
        ]
    if pad_bytes > 0:
        # Deterministic, incompressible padding bytes.
        data = hashlib.shake_256(f"openmed-synthetic-pad:{repo}".encode()).digest(pad_bytes)
        pad = TensorProto()
        pad.name = "padding"
        pad.data_type = TensorProto.UINT8
        pad.dims.append(pad_bytes)
        pad.raw_data = data
        inits.append(pad)
        if pad_resident:
            # Keep the padding alive in the session: Gather one byte at an index
            # that depends on the input shape (so constant folding cannot drop
            # it), multiply by zero and add to the logits.  Cost per run: O(1).
            last = "logits_pre_pad"
            for node in nodes:
                node.output[:] = [last if o == "logits" else o for o in node.output]
            inits += [
                numpy_helper.from_array(np.array(0, dtype=np.int64), name="pad_axis0"),
                numpy_helper.from_array(np.array(0, dtype=np.int64), name="pad_zero_i"),
                numpy_helper.from_array(np.array(0.0, dtype=np.float32), name="pad_zero_f"),
            ]
            nodes += [
                helper.make_node("Shape", ["input_ids"], ["pad_shape"]),
                helper.make_node("Gather", ["pad_shape", "pad_axis0"], ["pad_b"], axis=0),
                helper.make_node("Mul", ["pad_b", "pad_zero_i"], ["pad_idx"]),
                helper.make_node("Gather", ["padding", "pad_idx"], ["pad_byte"], axis=0),
                helper.make_node("Cast", ["pad_byte"], ["pad_f"], to=TensorProto.FLOAT),
                helper.make_node("Mul", ["pad_f", "pad_zero_f"], ["pad_term"]),
                helper.make_node("Add", [last, "pad_term"], ["logits"]),
            ]
    num_labels = table.shape[1]
    graph = helper.make_graph(
        nodes,
        "synthetic_token_classifier",
        inputs=[
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        outputs=[
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", num_labels]),
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="openmed-synthetic-make_model",
        producer_version=GENERATOR_VERSION,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tests/workload/make-model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("repo", metavar="ID", help="the model id, org/name (e.g. OpenMed/synthetic-pii-v4)")
    p.add_argument("--cache", required=True, help="HF hub cache dir (profile cache_dir)")
    p.add_argument("--labels", default="NAME,DATE,LOCATION,PHONE",
                   help=f"comma list from {','.join(KNOWN_LABELS)}")
    p.add_argument("--misses", action="append", default=[],
                   help="label kept in id2label but never predicted (repeatable)")
    p.add_argument("--fail-requests", action="store_true",
                   help="graph loads but every run with seq_len > --fail-above-tokens errors")
    p.add_argument("--fail-above-tokens", type=int, default=0,
                   help="with --fail-requests: runs with at most this many tokens "
                        "(incl. [CLS]/[SEP]) still succeed (default 0 = all fail)")
    p.add_argument("--size-mb", type=float, default=0.0,
                   help="add an unused initializer of this many MiB")
    p.add_argument("--pad-resident", action="store_true",
                   help="with --size-mb: reference the padding from the graph so ONNX "
                        "Runtime keeps it in memory (RSS grows by ~N MiB); default "
                        "padding is unused and dropped by ORT after parsing")
    p.add_argument("--max-len", type=int, default=512, help="max_position_embeddings")
    p.add_argument("--force", action="store_true",
                   help="replace a model of the same id made with other options")
    args = p.parse_args(argv)

    org_name = args.repo.split("/")
    part = re.compile(r"[A-Za-z0-9._-]+")
    if len(org_name) != 2 or not all(part.fullmatch(x) for x in org_name):
        p.error(f"{args.repo!r} is not an id the service accepts: org/name, "
                "each of letters, digits, '.', '_', '-'")
    labels = [x.strip().upper() for x in args.labels.split(",") if x.strip()]
    for lab in labels + [m.upper() for m in args.misses]:
        if lab not in KNOWN_LABELS:
            p.error(f"unknown label {lab!r}; known: {', '.join(KNOWN_LABELS)}")
    misses = sorted({m.upper() for m in args.misses})
    for m in misses:
        if m not in labels:
            labels.append(m)  # a missed label still appears in id2label
    labels = [lab for lab in KNOWN_LABELS if lab in labels]  # canonical order

    id2label = {0: "O"}
    for lab in labels:
        id2label[len(id2label)] = f"B-{lab}"
        id2label[len(id2label)] = f"I-{lab}"
    label2id = {v: k for k, v in id2label.items()}

    vocab, word_label = build_vocab(lexicon())
    table = np.zeros((len(vocab), len(id2label)), dtype=np.float32)
    counts = {lab: 0 for lab in labels}
    for word, idx in vocab.items():
        prefix, lab = word_label.get(word, ("", "O"))
        if lab == "O" or lab not in labels or lab in misses:
            table[idx, 0] = LOGIT_HIGH
        else:
            table[idx, label2id[f"{prefix}-{lab}"]] = LOGIT_HIGH
            counts[lab] += 1

    pad_bytes = int(round(args.size_mb * 1024 * 1024))
    model = build_graph(table, fail=args.fail_requests, fail_above=args.fail_above_tokens,
                        pad_bytes=pad_bytes, pad_resident=args.pad_resident, repo=args.repo)
    model_bytes = model.SerializeToString(deterministic=True)

    tokenizer = build_tokenizer(vocab, args.max_len)
    files: dict[str, bytes] = {
        "model.onnx": model_bytes,
        "tokenizer.json": tokenizer.to_str(pretty=False).encode("utf-8"),
        "config.json": json.dumps(
            {
                "architectures": ["BertForTokenClassification"],
                "model_type": "bert",
                "id2label": {str(k): v for k, v in id2label.items()},
                "label2id": label2id,
                "num_labels": len(id2label),
                "pad_token_id": 0,
                "max_position_embeddings": args.max_len,
                "vocab_size": len(vocab),
                "openmed_synthetic": {
                    "generator_version": GENERATOR_VERSION,
                    "labels": labels,
                    "misses": misses,
                    "fail_requests": bool(args.fail_requests),
                    "fail_above_tokens": args.fail_above_tokens if args.fail_requests else None,
                    "padding_bytes": pad_bytes,
                    "padding_resident": bool(args.pad_resident and pad_bytes),
                },
            },
            indent=2, sort_keys=True,
        ).encode() + b"\n",
        "tokenizer_config.json": json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": args.max_len,
                "pad_token": "[PAD]", "unk_token": "[UNK]",
                "cls_token": "[CLS]", "sep_token": "[SEP]",
                "do_lower_case": True,
            },
            indent=2, sort_keys=True,
        ).encode() + b"\n",
        "special_tokens_map.json": json.dumps(
            {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"},
            indent=2, sort_keys=True,
        ).encode() + b"\n",
    }

    # Deterministic pseudo commit: sha1 over the sorted (name, sha256) list.
    manifest = "".join(f"{n}\0{hashlib.sha256(b).hexdigest()}\n" for n, b in sorted(files.items()))
    commit = hashlib.sha1(f"{args.repo}\n{manifest}".encode()).hexdigest()

    repo_dir = Path(args.cache) / f"models--{org_name[0]}--{org_name[1]}"
    existing = repo_dir / "refs" / "main"
    if existing.exists() and existing.read_text() == commit:
        pass  # the same arguments made it before: the same bytes are there
    else:
        if repo_dir.exists() and not args.force:
            print(f"error: {repo_dir} holds {args.repo} made with other options "
                  "(--force replaces it)", file=sys.stderr)
            return 2
        # Written beside it, then moved in: never half a model in the cache.
        staging = Path(args.cache) / f".make-model-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        snap = staging / "snapshots" / commit
        snap.mkdir(parents=True)
        (staging / "refs").mkdir()
        (staging / "refs" / "main").write_text(commit)  # no trailing newline, like HF
        for name, data in files.items():
            (snap / name).write_bytes(data)
        if repo_dir.exists():
            shutil.rmtree(repo_dir)
        os.rename(staging, repo_dir)
    snap = repo_dir / "snapshots" / commit

    summary = {
        "repo": args.repo,
        "repo_dir": str(repo_dir),
        "commit": commit,
        "snapshot": str(snap),
        "id2label": id2label,
        "tagged_words_per_label": counts,
        "misses": misses,
        "fail_requests": bool(args.fail_requests),
        "model_onnx_bytes": len(model_bytes),
        "vocab_size": len(vocab),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
