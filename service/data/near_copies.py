"""Near copies of a pending upload (issue 40): which of its examples are near duplicates of
an example of an existing budget group, for the data owner who decides on it
(:mod:`service.data.approvals`).

The exact overlap (:func:`service.data.budget_groups.overlap_report`) sees only copies whose
canonical key is the same; a copy with a word changed in each line is new data to it. Here,
two examples are **near duplicates** when the Jaccard similarity of their word sets is at
least :data:`THRESHOLD` (0.8):

* an example's words are those of its canonical text (:func:`canonical_text`: NFKC,
  case-folded, whitespace runs one space), split at spaces; its shingles are its distinct
  runs of :data:`SHINGLE_WORDS` words (1: its set of words; a text shorter than that is one
  shingle of all its words). One word: an edit of one word in a line of ``n`` distinct words
  leaves a Jaccard of (n-1)/(n+1), 0.8 from 9 words on; three-word shingles would lose three
  shingles to one edit in the middle of a line ((n-5)/(n+1): 0.8 only from 29 words), so
  short examples edited once a line would pass unseen. The price: the order of words is not
  seen (a line with its words shuffled is a near duplicate) and templated lines that differ
  in one word of ten count as near duplicates; a person reads the examples and decides;
* candidates are found with MinHash and LSH (the ``datasketch`` library: :data:`NUM_PERM`
  permutations, :data:`BANDS` bands of :data:`ROWS` rows, seed :data:`SEED`): a pair at
  Jaccard 0.8 becomes a candidate with probability 0.947, at 0.85 with 0.994, at 0.9 with
  0.9997 (1 - (1 - J^8)^16); at 0.5 with 0.06. Each candidate's Jaccard is then computed
  exactly from the two word sets (at most :data:`MAX_CANDIDATES` candidates of a group for
  one example): a count is never too high, and may miss a near duplicate that LSH missed;
* counted per group: the upload's distinct examples (by canonical key) that are not an exact
  copy of an example read from any group (those are counted by the exact overlap already,
  ``shared_examples``) and are a near duplicate of one of the group's examples. An exact
  copy of an example whose content is gone (a deleted file, hashes kept) is not seen here,
  and may count in both;
* bounded: the first :data:`NEAR_SAMPLE` examples of the upload, and of each group the first
  :data:`NEAR_SAMPLE` examples of its files whose content is on disk (approved, not deleted,
  in upload order), at most :data:`NEAR_TOTAL` examples of all groups together (groups in the
  order of their first file); ``near_sample_limited`` says when a bound cut.

The report keeps, for each group, up to :data:`EXAMPLES` pairs (the first in the upload's
order: its line number and text, the group's text, their Jaccard), each text cut at
:data:`TEXT_MAX` characters. They are private text: the API shows them only to a caller who
may decide (``api/files/views.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasketch import MinHash, MinHashLSH
from sqlalchemy import select
from sqlalchemy.orm import Session

from dprc_core.training.data import DataError, read_examples
from service.data.budget_groups import REPORT_GROUPS
from service.data.example_hashes import canonical_text
from service.store.tables import BudgetGroup, File

THRESHOLD = 0.8
SHINGLE_WORDS = 1
NUM_PERM = 128
BANDS, ROWS = 16, 8  # 128 = 16 x 8: recall 0.947 at J = 0.8 (see above)
SEED = 1
NEAR_SAMPLE = 20000  # examples of the upload, and of each group, compared
NEAR_TOTAL = 5 * NEAR_SAMPLE  # examples of all groups together
MAX_CANDIDATES = 32  # candidates of one group checked exactly for one example
EXAMPLES = 3  # pairs kept per group
TEXT_MAX = 500  # characters of a text kept in a pair


@dataclass(frozen=True)
class Line:
    """An example as read from its file: its line number (1-based) and its text."""

    number: int
    text: str


@dataclass
class GroupNear:
    """A group's near duplicates: how many of the upload's examples, and the first pairs."""

    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class NearCopies:
    groups: dict[str, GroupNear]
    limited: bool


def shingles(canonical: str, k: int = SHINGLE_WORDS) -> frozenset[str]:
    """The distinct runs of ``k`` words of a canonical text (all its words as one shingle
    when it has fewer; none when it is empty)."""
    words = canonical.split(" ") if canonical else []
    if not words:
        return frozenset()
    if k == 1:
        return frozenset(words)
    k = min(k, len(words))
    return frozenset(" ".join(words[i : i + k]) for i in range(len(words) - k + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def read_lines(path: Path, user_field: str | None, limit: int) -> tuple[list[Line], bool]:
    """The first ``limit`` examples of a JSONL data set with their line numbers, and whether
    it holds more. A file that cannot be read (gone, or not a data set) gives the examples
    read before the failure (none when it is gone)."""
    lines: list[Line] = []
    number = 0

    def numbered(fh: Iterable[bytes]) -> Iterator[bytes]:
        nonlocal number  # the line the example read last came from
        for raw in fh:
            number += 1
            yield raw

    try:
        with open(path, "rb") as fh:
            for ex in read_examples(numbered(fh), user_field=user_field):
                if len(lines) == limit:
                    return lines, True
                lines.append(Line(number, ex.text))
    except (OSError, DataError):
        return lines, False
    return lines, False


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 1] + "…"


def _minhashes(sets: Iterable[frozenset[str]], seed: int) -> Iterator[MinHash]:
    return MinHash.generator(
        ([s.encode("utf-8") for s in shingle_set] for shingle_set in sets),
        num_perm=NUM_PERM,
        seed=seed,
    )


def find(
    upload: Sequence[Line], groups: Mapping[str, Sequence[str]], seed: int = SEED
) -> dict[str, GroupNear]:
    """The near duplicates of the upload's examples in each group's texts (the module's
    rules; pure: no database, no files). Groups without any are left out."""
    g_canon: list[str] = []
    g_text: list[str] = []
    g_group: list[str] = []
    exact: set[str] = set()
    for gid, texts in groups.items():
        seen: set[str] = set()
        for text in texts:
            canon = canonical_text(text)
            if canon in seen or not canon:
                continue
            seen.add(canon)
            g_canon.append(canon)
            g_text.append(text)
            g_group.append(gid)
        exact |= seen
    queries: list[tuple[Line, frozenset[str]]] = []
    asked: set[str] = set()
    for line in upload:
        canon = canonical_text(line.text)
        if canon in asked or canon in exact or not canon:
            continue
        asked.add(canon)
        queries.append((line, shingles(canon)))
    if not g_canon or not queries:
        return {}
    lsh = MinHashLSH(num_perm=NUM_PERM, params=(BANDS, ROWS))
    for i, m in enumerate(_minhashes((shingles(c) for c in g_canon), seed)):
        lsh.insert(i, m, check_duplication=False)
    found: dict[str, GroupNear] = {}
    qsets = [s for _, s in queries]
    for (line, mine), m in zip(queries, _minhashes(qsets, seed)):
        by_group: dict[str, list[int]] = {}
        for i in sorted(lsh.query(m)):
            by_group.setdefault(g_group[i], []).append(i)
        for gid, candidates in by_group.items():
            best, best_j = -1, 0.0
            for i in candidates[:MAX_CANDIDATES]:
                j = jaccard(mine, shingles(g_canon[i]))
                if j > best_j:
                    best, best_j = i, j
            if best_j < THRESHOLD:
                continue
            near = found.setdefault(gid, GroupNear())
            near.count += 1
            if len(near.examples) < EXAMPLES:
                near.examples.append(
                    {
                        "line": line.number,
                        "text": _cut(line.text),
                        "group_text": _cut(g_text[best]),
                        "jaccard": round(best_j, 3),
                    }
                )
    return found


def near_copies(
    upload: Sequence[Line], files: Iterable[File], *, limited: bool = False, seed: int = SEED
) -> NearCopies:
    """:func:`find` over the groups of ``files`` (rows of data sets whose content is on disk,
    in upload order), each group read up to the bounds; ``limited``: the upload was cut."""
    texts: dict[str, list[str]] = {}
    total = 0
    for f in files:
        if f.group_id is None:
            continue
        have = texts.setdefault(f.group_id, [])
        room = min(NEAR_SAMPLE - len(have), NEAR_TOTAL - total)
        if room <= 0:
            limited = True
            continue
        lines, more = read_lines(Path(f.storage_path), f.user_field, room)
        have += [line.text for line in lines]
        total += len(lines)
        limited = limited or more
    return NearCopies(find(upload, texts, seed), limited)


def group_files(session: Session, tenant_id: int) -> list[File]:
    """The tenant's data sets in budget groups whose content is on disk, in upload order."""
    return list(
        session.scalars(
            select(File)
            .where(
                File.tenant_id == tenant_id,
                File.group_id.is_not(None),
                File.deleted.is_(False),
                File.approval == "approved",
            )
            .order_by(File.seq)
        )
    )


def merge(
    report: dict[str, Any], near: NearCopies, groups: Mapping[str, BudgetGroup]
) -> dict[str, Any]:
    """The exact overlap ``report`` with each listed group's ``near_duplicates`` and
    ``examples``, and the groups found only through near duplicates added after them (most
    first; ``groups`` holds their rows), at most ``REPORT_GROUPS`` listed. ``groups_total``
    counts those added too (a group beyond the exact report's first ``REPORT_GROUPS`` that
    also has near duplicates counts twice: only with more than that many groups)."""
    listed = []
    for entry in report["groups"]:
        near_g = near.groups.get(entry["budget_group"], GroupNear())
        listed.append({**entry, "near_duplicates": near_g.count, "examples": near_g.examples})
    known = {entry["budget_group"] for entry in report["groups"]}
    extra = sorted(
        ((gid, g) for gid, g in near.groups.items() if gid not in known),
        key=lambda kv: (-kv[1].count, kv[0]),
    )
    for gid, near_g in extra:
        if len(listed) >= REPORT_GROUPS:
            break
        group = groups[gid]
        listed.append(
            {
                "budget_group": gid,
                "shared_examples": 0,
                "privacy_unit": group.privacy_unit,
                "epsilon_budget": group.epsilon_budget,
                "delta": group.delta,
                "near_duplicates": near_g.count,
                "examples": near_g.examples,
            }
        )
    return {
        **report,
        "groups": listed,
        "groups_total": report["groups_total"] + len(extra),
        "near_threshold": THRESHOLD,
        "near_sample_limited": near.limited,
    }


def of_upload(session: Session, tenant_id: int, path: Path, user_field: str | None) -> NearCopies:
    """The near copies of an upload (its content at ``path``) in the tenant's groups."""
    upload, limited = read_lines(path, user_field, NEAR_SAMPLE)
    return near_copies(upload, group_files(session, tenant_id), limited=limited)


def with_near_copies(
    session: Session,
    tenant_id: int,
    path: Path,
    user_field: str | None,
    report: dict[str, Any],
    near: NearCopies | None = None,
) -> dict[str, Any]:
    """A pending upload's report (its content at ``path``) with its near copies: ``near``
    when they were found before the tenant's lock was taken (the slow part, seconds for
    20,000 lines: :func:`service.data.files.store_data_set` does it outside the lock for an upload
    that will wait), else found now."""
    if near is None:
        near = of_upload(session, tenant_id, path, user_field)
    ids = list(near.groups)
    rows = (
        {
            g.id: g
            for g in session.scalars(
                select(BudgetGroup).where(
                    BudgetGroup.tenant_id == tenant_id, BudgetGroup.id.in_(ids)
                )
            )
        }
        if ids
        else {}
    )
    return merge(report, near, rows)


def without_texts(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report with its example pairs' texts dropped (kept: the counts): once an upload is
    decided or deleted, the private text it quoted has no reason to stay in the database."""
    if report is None:
        return None
    groups = [{**g, "examples": None} for g in report.get("groups", [])]
    return {**report, "groups": groups}
