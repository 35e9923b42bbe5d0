"""What the image handler's preprocessing costs per request, one thread, by payload, and whether it
changes a real classifier's answers (what `make bench-preprocess` runs): each path of
bench.studies.photo_agreement.PATHS, the whole decode against libjpeg's reduced (DCT-scaled) decodes.

    .venv/bin/python -m bench.studies.preprocess [--repeats 30] [--centred-only]

Payloads: the bench's 640x480 JPEG, and real photographs (bench.payloads.PHOTOS) as a 12 MP phone
photo (4032x3024, JPEG quality 90). Agreement: bench/studies/photo_agreement.py, on 242 framings of those
photos. Results: bench/results/preprocess-<time>/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.payloads import PHOTOS, phone_jpeg, photo_jpeg
from bench.results import RESULTS, RunEnvironment
from bench.studies.photo_agreement import DECISIVE_MARGIN, PATHS, Preprocess, compare, phone_views


def median_ms(preprocess: Preprocess, data: bytes, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        preprocess(data)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--centred-only", action="store_true", help="agreement on 33 centred views, not 242")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    payloads = {
        "640x480 JPEG": photo_jpeg(),
        **{f"12 MP JPEG ({Path(name).stem})": phone_jpeg(name) for name in PHOTOS[:3]},
    }
    rows = []
    for name, data in payloads.items():
        ms = {path: median_ms(preprocess, data, args.repeats) for path, preprocess in PATHS.items()}
        rows.append({"payload": name, "bytes": len(data), "ms": ms})
        print(f"[preprocess] {name}: " + ", ".join(f"{path} {t:.1f} ms" for path, t in ms.items()), flush=True)
    started = time.monotonic()
    print("[preprocess] agreement: framing the photos as 12 MP JPEGs, classifying each path (~2 min)", flush=True)
    views = phone_views(args.centred_only)
    agreements = compare(views)
    print(f"[preprocess] agreement on {len(views)} views in {time.monotonic() - started:.0f} s", flush=True)
    env = RunEnvironment.capture()
    out = RESULTS / f"preprocess-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    (out / "results.json").write_text(
        json.dumps(
            {
                "environment": dataclasses.asdict(env),
                "rows": rows,
                "agreement": [dataclasses.asdict(a) for a in agreements],
            },
            indent=2,
        )
    )
    lines = [
        f"CPU: {env.cpu_model}; commit {env.git_commit}; one thread; median of {args.repeats}; `make bench-preprocess`",
        "",
        "| payload | body | " + " | ".join(f"{path}, ms" for path in PATHS) + " |",
        "|---|---|" + "---|" * len(PATHS),
        *(
            f"| {r['payload']} | {r['bytes'] / 1e6:.2f} MB | " + " | ".join(f"{t:.1f}" for t in r["ms"].values()) + " |"
            for r in rows
        ),
        "",
        f"Against the whole decode, EfficientNet-Lite0 (ImageNet weights), {len(views)} views of"
        f" {len(PHOTOS)} real photographs as 12 MP JPEGs; decisive = the whole decode's top-1 ahead of its"
        f" second by >= {DECISIVE_MARGIN}:",
        "",
        "| preprocessing | top-1 agreement | on decisive views | largest margin flipped | max probability difference |",
        "|---|---|---|---|---|",
        *(
            f"| {a.path} | {a.top1:.1%} of {a.views} | {a.decisive_top1:.1%} of {a.decisive_views} |"
            f" {a.largest_flipped_margin:.3f} | {a.max_probability_difference:.3f} |"
            for a in agreements
        ),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"[preprocess] results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
