"""Names come from the domain: the package, its tests, benchmarks and docs cite nothing a
reader of the repository cannot open (a product brief kept elsewhere, this project's tracker),
and no held-out check is named by the year it was drawn in."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Projects whose public trackers may be cited by number ("mlx-lm issue #596").
UPSTREAM = {"mlx", "mlx-lm", "mlx-examples", "mlx-lm-lora", "mlx-vlm", "transformers", "huggingface_hub"}

# Each pattern is written in pieces so that this file does not match itself.
YEAR_NAMED_CHECK = re.compile("heldout" + r"_20\d\d")
BRIEF_CITATION = re.compile("SPEC" + r"(\.md)?\s*§")
ISSUE_NUMBER = re.compile(r"(?i)(?<![\w-])" + "issue" + r"s?\s+#?\d+")


def stray_names(text: str) -> list[str]:
    """What in `text` names a year-named check, cites the brief, or cites a tracker number
    that is not an upstream project's (the word before it names the project)."""
    found = [m.group(0) for m in YEAR_NAMED_CHECK.finditer(text)]
    found += [m.group(0) for m in BRIEF_CITATION.finditer(text)]
    for m in ISSUE_NUMBER.finditer(text):
        before = text[: m.start()].rstrip(" \t(\"'`").split()
        project = before[-1].strip("(\"'`[").lower() if before else ""
        if project not in UPSTREAM and "/" not in project:
            found.append(m.group(0))
    return found


def test_the_finder_tells_our_tracker_from_upstream_ones():
    issue, year_named, brief = "iss" + "ue", "heldout" + "_2031", "SP" + "EC"
    ours = [f"{issue.title()} 12 item 4: a stored measurement", f"the kinds {issue} 19 named weakest",
            f"left blocked ({issue} 19)", f"see {issue}s 32", f"{year_named}()", f"{brief}.md §2", f"({brief} §5)"]
    theirs = [f"(mlx-lm {issue} #596)", f"ml-explore/mlx {issue} #3539", "mlx-examples #686",
              f"the {issue}'s example", "checks drawn with seeds 2030 and 2031"]
    for text in ours:
        assert stray_names(text), text
    for text in theirs:
        assert not stray_names(text), text


@pytest.mark.parametrize("folder", ["mlxfit", "tests", "benchmarks", "docs"])
def test_no_stray_names_in_the_code_its_tests_and_docs(folder):
    """benchmarks/results/ and benchmarks/evidence/ are data, written by the scripts or quoted."""
    files = [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".json", ".md") and p.is_file()
             and not {"results", "evidence"} & set(p.relative_to(ROOT).parts)]
    stray = {str(p.relative_to(ROOT)): names for p in files if (names := stray_names(p.read_text(encoding="utf-8")))}
    assert not stray


@pytest.mark.parametrize("folder", ["mlxfit", "tests", "benchmarks", "docs"])
def test_every_test_or_benchmark_file_named_exists(folder):
    """A comment that says which test pins a fact names a file that is there (renames included)."""
    named = re.compile(r"\b((?:tests|benchmarks)/[\w/]+\.py)\b")
    files = [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".json", ".md") and p.is_file()
             and "results" not in p.relative_to(ROOT).parts]
    missing = {str(p.relative_to(ROOT)): sorted({m for m in named.findall(p.read_text(encoding="utf-8"))
                                                 if not (ROOT / m).exists()})
               for p in files}
    assert not {path: names for path, names in missing.items() if names}
