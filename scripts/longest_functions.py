"""The longest functions of the project's packages, by source lines (an AST walk).

Usage: ``python scripts/longest_functions.py [N]`` prints the N longest (default 15), one per
line: lines, ``path:line``, name. A design-review figure, not a test.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("dprc_core", "service", "api", "worker", "dprc")
ROOT = Path(__file__).resolve().parents[1]


def function_lengths() -> list[tuple[int, str, str]]:
    rows: list[tuple[int, str, str]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    rows.append((length, where, node.name))
    return sorted(rows, reverse=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    for length, where, name in function_lengths()[:n]:
        print(length, where, name)


if __name__ == "__main__":
    main()
