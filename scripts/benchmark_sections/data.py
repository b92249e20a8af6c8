"""data: how fast the DataLoader workers feed training on this machine
(``scripts/bench_data.py``), the pipeline alone and whole training steps."""

from __future__ import annotations

from doctools.commands import Run
from doctools.markdown import table

NAME = "data"
HEADING = "The input pipeline"
QUESTION = "How fast the DataLoader workers feed training on this machine."
MINUTES = 1
DEFAULT = True


def measure(run: Run) -> dict:
    run("python scripts/bench_data.py --trials 2 --json data.json")
    return run.json("data.json")


def _workers(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'}" if n else "no workers"


def render(r: dict) -> list[str]:
    rows = {x["workers"]: x for x in r["rows"]}
    body = [
        [
            str(w),
            f"{x['loader_img_s']:.0f}",
            f"{x['first_batch_s']:.2f}",
            f"{x['train_img_s']:.0f}",
            f"{x['data_ms']:.1f}",
            f"{x['compute_ms']:.1f}",
        ]
        for w, x in rows.items()
    ]
    none = rows[min(rows)]
    loader = max(rows, key=lambda w: rows[w]["loader_img_s"])
    train = max(rows, key=lambda w: rows[w]["train_img_s"])
    with_workers = [x for w, x in rows.items() if w > 0]
    reading = [
        f"- The pipeline alone was fastest with {_workers(loader)}: {rows[loader]['loader_img_s']:.0f} images/s, "
        f"{rows[loader]['loader_img_s'] / none['loader_img_s']:.2f}x the training process decoding alone.",
        f"- In training the highest rate came with {_workers(train)}: {rows[train]['train_img_s']:.0f} images/s, "
        + ", ".join(f"{x['train_img_s']:.0f} with {_workers(w)}" for w, x in rows.items() if w != train)
        + ".",
    ]
    if with_workers:
        compute = [x["compute_ms"] for x in with_workers]
        slower = min(compute) > none["compute_ms"]
        reading.append(
            f"- The wait for data was {none['data_ms']:.1f} ms a step with no workers and "
            f"{min(x['data_ms'] for x in with_workers):.1f} to {max(x['data_ms'] for x in with_workers):.1f} ms with "
            f"them; compute {none['compute_ms']:.1f} ms without and {min(compute):.1f} to {max(compute):.1f} ms with"
            + (": on 2 cores the workers' decoding takes cores from the training process's threads." if slower else ".")
        )
    return [
        f"{r['images']} training JPEGs of 64 to 256 px made by `scripts/make_imagefolder.py`, the {r['model']} model "
        f"at {r['image_size']} px, global batch {r['batch']} on `{r['devices']}`; the worker counts measured "
        f"round-robin, medians of {r['trials']} trials. `loader img/s`: the pipeline alone (decode, crop, flip, "
        f"collate), {r['loader_steps']} batches after {r['warmup']}; `first batch s`: the time to the first batch; "
        f"`train img/s`: the trainer's figure over {r['train_steps']} steps, data wait included; `data wait ms` and "
        "`compute ms`: the trainer's per-step means.",
        "",
        *table(["workers", "loader img/s", "first batch s", "train img/s", "data wait ms", "compute ms"], body),
        "",
        *reading,
    ]


def headline(r: dict) -> list[str] | None:
    """None: no figure of this section is in the README's headline table."""
    return None
