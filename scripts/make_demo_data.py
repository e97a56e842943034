"""Write the demo data set shipped in data/demo/: short product reviews labelled positive or
negative, built from templates with a fixed seed (deterministic; run again to check).

It is small and synthetic on purpose: `make demo` must finish in minutes on 2 CPU cores and
reach clearly better than chance held-out accuracy at epsilon = 8. Train and test use disjoint
products, so the test measures the sentiment words, not memorised items."""

from __future__ import annotations

import json
import random
from pathlib import Path

PRODUCTS = [
    "blender",
    "kettle",
    "backpack",
    "keyboard",
    "lamp",
    "tent",
    "phone case",
    "coffee grinder",
    "bike lock",
    "desk chair",
    "monitor",
    "toaster",
    "rain jacket",
    "headphones",
    "water bottle",
    "drill",
    "printer",
    "mattress",
    "router",
    "camera",
    "frying pan",
    "vacuum",
    "watch",
    "speaker",
]
GOOD = [
    "great",
    "excellent",
    "reliable",
    "sturdy",
    "wonderful",
    "fantastic",
    "solid",
    "comfortable",
    "impressive",
    "delightful",
    "superb",
    "well made",
]
BAD = [
    "terrible",
    "flimsy",
    "awful",
    "useless",
    "disappointing",
    "cheap",
    "broken",
    "uncomfortable",
    "horrible",
    "faulty",
    "poorly made",
    "defective",
]
GOOD_TAIL = [
    "I would buy it again.",
    "Highly recommended.",
    "Works perfectly every day.",
    "It exceeded my expectations.",
    "Worth every penny.",
    "Very happy with it.",
]
BAD_TAIL = [
    "I want a refund.",
    "Avoid it.",
    "It stopped working after a week.",
    "It did not meet my expectations.",
    "A waste of money.",
    "Very unhappy with it.",
]
TEMPLATES = [
    "This {p} is {a}. {t}",
    "A {a} {p}. {t}",
    "The {p} I got was {a}. {t}",
    "Honestly, a {a} {p}. {t}",
    "{t} The {p} is simply {a}.",
]


def make(products: list[str], n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        words, tails = (GOOD, GOOD_TAIL) if positive else (BAD, BAD_TAIL)
        text = rng.choice(TEMPLATES).format(
            p=rng.choice(products), a=rng.choice(words), t=rng.choice(tails)
        )
        rows.append({"text": text, "label": "positive" if positive else "negative"})
    rng.shuffle(rows)
    return rows


OUT = Path(__file__).resolve().parents[1] / "data" / "demo"


def main(out: Path = OUT) -> None:
    rng = random.Random(20261130)
    products = PRODUCTS[:]
    rng.shuffle(products)
    train_products, test_products = products[:18], products[18:]
    out.mkdir(parents=True, exist_ok=True)
    for name, prods, n in (
        ("reviews_train", train_products, 800),
        ("reviews_test", test_products, 200),
    ):
        rows = make(prods, n, rng)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
