"""The documentation runs as written: every code block of README.md and docs/*.md, in order.

Each page runs in a fresh Python process with a temporary working directory of its own:
its ``python`` blocks share one namespace (a block sees the names and files of the blocks
before it), ``>>>`` blocks run as doctests in that namespace, and its command blocks
(``bash``, or unlabelled blocks whose first line is a ``wflow``, ``python`` or ``pip``
command) run in order with ``bash -e`` in the same directory. One test per block.

What a page shows is checked: a ``>>>`` example against the lines under it, a block followed
directly by a ``text`` block (only blank lines between) against what it printed. Text must
match up to white space (``...`` stands for anything); every number must agree to 1e-2
relative or to half a unit of its last printed digit, whichever is larger.

Markers, on the lines just before a block's fence, in a MyST comment ``% docs-runner: ...``
or an HTML comment ``<!-- docs-runner: ... -->`` (README.md, which GitHub renders):

* ``skip (reason)``: the block is not run and the test is reported skipped with the reason
  (pretrained weights, a GPU, a cluster, or minutes of running);
* ``requires MODULE``: skipped, with the reason, where ``MODULE`` cannot be imported;
* ``file NAME``: the block is written to ``NAME`` in the page's directory (a config file the
  commands after it read); it is not run.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_TIMEOUT_S = 600

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)")
_MARKER = re.compile(r"^\s*(?:%|<!--)\s*docs-runner:\s*(.*?)\s*(?:-->)?\s*$")
_SHELL = {"bash", "sh", "shell"}
_COMMANDS = ("wflow ", "python ", "pip ")


@dataclass
class Block:
    """One code block of a page: where it is, what it does and what it shows."""

    page: str
    line: int  # the line of its opening fence (1-based)
    kind: str  # "python", "doctest", "shell" or "file"
    code: str
    skip: str | None = None
    requires: str | None = None
    file: str | None = None
    expected: str | None = None  # the text block printed under it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _kind(lang: str, body: list[str]) -> str | None:
    code = [ln.strip() for ln in body if ln.strip() and not ln.strip().startswith("#")]
    if lang in {"python", "py", "pycon"}:
        return "doctest" if code and code[0].startswith(">>>") else "python"
    if lang in _SHELL or (lang == "" and code and code[0].startswith(_COMMANDS)):
        return "shell"
    return None


def _apply(marker: str, where: str, block: Block) -> None:
    if m := re.fullmatch(r"skip \((.+)\)", marker):
        block.skip = m.group(1)
    elif m := re.fullmatch(r"requires ([\w.]+)", marker):
        block.requires = m.group(1)
    elif m := re.fullmatch(r"file (\S+)", marker):
        block.kind, block.file = "file", m.group(1)
    else:
        raise ValueError(
            f"{where}: unknown docs-runner marker {marker!r} "
            "(skip (reason), requires MODULE or file NAME)"
        )


def parse_page(path: Path, root: Path = ROOT) -> list[Block]:
    """The runnable blocks of one Markdown page, in order, with their markers and outputs."""
    name = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    markers: list[tuple[int, str]] = []
    last: Block | None = None  # the block just closed, while only blank lines follow it
    i = 0
    while i < len(lines):
        if m := _MARKER.match(lines[i]):
            markers.append((i + 1, m.group(1)))
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                last = None
                if markers:
                    raise ValueError(
                        f"{name}:{markers[0][0]}: a docs-runner marker not before a fence"
                    )
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(1)):
            end += 1
        body = textwrap.dedent("\n".join(lines[i + 1 : end])).split("\n")
        lang = fence.group(2).lower()
        kind = _kind(lang, body)
        block = Block(name, i + 1, kind or "", "\n".join(body) + "\n")
        for line, marker in markers:
            _apply(marker, f"{name}:{line}", block)
        if markers and not block.kind:
            raise ValueError(f"{name}:{markers[0][0]}: a docs-runner marker before a {lang} block")
        markers = []
        if block.kind:
            blocks.append(block)
            last = block
        elif lang == "text" and last is not None and last.kind in {"python", "shell"}:
            last.expected = block.code
            last = None
        else:
            last = None
        i = end + 1
    if markers:
        raise ValueError(f"{name}:{markers[0][0]}: a docs-runner marker at the end of the page")
    return blocks


BLOCKS = [b for page in PAGES for b in parse_page(page)]


# The page's process: ``python tests/test_docs_run.py RESULTS`` reads the blocks as JSON on
# stdin and writes one result per block as JSON to RESULTS.

_NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
# a whole number (not the digits of a word, dopri5), perhaps followed by "..."
_WHOLE = r"(?<![\w.])" + _NUMBER + r"(?!\w)(?!\.(?!\.\.))"


def _pattern(expected: str) -> tuple[str, list[str]]:
    """A regular expression for ``expected`` with a group per number, and those numbers."""
    parts, numbers = [], []
    for piece in re.split(r"(\.\.\.|" + _WHOLE + r"|\s+)", expected.strip()):
        if piece == "...":
            parts.append(r".*?")
        elif piece.isspace():
            parts.append(r"\s*")
        elif re.fullmatch(_NUMBER, piece):
            parts.append("(" + _WHOLE + ")")
            numbers.append(piece)
        elif piece:
            parts.append(re.escape(piece))
    return "".join(parts), numbers


def _tolerance(shown: str) -> float:
    """1e-2 relative, or half a unit of the last digit shown, whichever is larger."""
    mantissa, _, exponent = shown.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return max(1e-2 * abs(float(shown)), 0.5 * 10.0 ** (int(exponent or 0) - decimals))


def compare(expected: str, printed: str) -> str | None:
    """None when ``printed`` shows what the page shows (``expected``), else why not."""
    pattern, numbers = _pattern(expected)
    m = re.fullmatch(r"\s*" + pattern + r"\s*", printed, re.DOTALL)
    if m is None:
        return "the output differs from the page"
    for want, got in zip(numbers, m.groups(), strict=True):
        if abs(float(got) - float(want)) > _tolerance(want):
            return f"printed {got} where the page shows {want}"
    return None


def _run_python(code: str, name: str, ns: dict) -> tuple[str, str | None]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), ns)
    except BaseException:
        return out.getvalue(), traceback.format_exc()
    return out.getvalue(), None


def _run_doctest(code: str, name: str, ns: dict) -> tuple[str, str | None]:
    shown = ""
    for example in doctest.DocTestParser().get_examples(code, name):
        source = ">>> " + example.source.strip().replace("\n", "\n... ")
        printed, why = _run_python_single(example.source, f"{name}+{example.lineno}", ns)
        shown += f"{source}\n{printed}"
        if why is None and (example.want.strip() or printed.strip()):
            why = compare(example.want, printed)
        if why:
            return shown, f"{why}\n{source}\nexpected:\n{example.want}printed:\n{printed}"
    return shown, None


def _run_python_single(code: str, name: str, ns: dict) -> tuple[str, str | None]:
    out = io.StringIO()  # an expression's value is displayed, as at the prompt
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "single"), ns)
    except BaseException:
        return out.getvalue(), traceback.format_exc()
    return out.getvalue(), None


def _run_shell(code: str, name: str, ns: dict) -> tuple[str, str | None]:
    proc = subprocess.run(["bash", "-e", "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode:
        return proc.stdout + proc.stderr, f"exit status {proc.returncode}"
    return proc.stdout, None


def main(result_path: str) -> None:
    """Run the blocks given as JSON on stdin, in order, in this directory; results to a file."""
    import matplotlib.pyplot as plt

    ns: dict = {"__name__": "__main__"}
    results: dict[str, dict] = {}
    for b in json.load(sys.stdin):
        name = f"{b['page']}:{b['line']}"
        if b["skip"]:
            results[name] = {"status": "skip", "reason": b["skip"]}
        elif b["requires"] and importlib.util.find_spec(b["requires"]) is None:
            results[name] = {"status": "skip", "reason": f"needs {b['requires']}, not installed"}
        elif b["kind"] == "file":
            Path(b["file"]).write_text(b["code"], encoding="utf-8")
        else:
            print(f"== {name} ({b['kind']})", file=sys.stderr, flush=True)
            start = time.perf_counter()
            run = {"python": _run_python, "doctest": _run_doctest, "shell": _run_shell}[b["kind"]]
            output, why = run(b["code"], name, ns)
            if why is None and b["expected"] is not None:
                why = compare(b["expected"], output)
                if why:
                    why += f"\nexpected:\n{b['expected']}printed:\n{output}"
            plt.close("all")
            results[name] = {
                "status": "fail" if why else "ok",
                "reason": why or "",
                "output": output[-4000:],
                "seconds": round(time.perf_counter() - start, 2),
            }
        Path(result_path).write_text(json.dumps(results))  # what ran, should the process die


def run_page(page: str, tmp: Path) -> dict[str, dict]:
    """Run every block of ``page`` in one process in ``tmp``: the result of each, by id."""
    blocks = [b for b in BLOCKS if b.page == page]
    result_path = tmp / ".docs-runner-results.json"
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, str(result_path)],
            input=json.dumps([asdict(b) for b in blocks]),
            capture_output=True,
            text=True,
            cwd=tmp,
            env=env,
            timeout=PAGE_TIMEOUT_S,
        )
        crash = f"the page's process ended with status {proc.returncode}:\n{proc.stderr[-4000:]}"
    except subprocess.TimeoutExpired:
        crash = f"the page ran past {PAGE_TIMEOUT_S} s"
    results = json.loads(result_path.read_text()) if result_path.exists() else {}
    return {b.id: results.get(b.id, {"status": "fail", "reason": crash}) for b in blocks}


@pytest.fixture(scope="session")
def page_results(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, dict]]:
    """The results of a page's blocks, from one run of the page in a directory of its own."""
    results: dict[str, dict[str, dict]] = {}

    def get(page: str) -> dict[str, dict]:
        if page not in results:
            results[page] = run_page(page, tmp_path_factory.mktemp(re.sub(r"\W", "_", page)))
        return results[page]

    return get


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind != "file"], ids=lambda b: b.id)
def test_block_runs_as_written(block: Block, page_results: Callable[[str], dict]) -> None:
    result = page_results(block.page)[block.id]
    if result["status"] == "skip":
        pytest.skip(f"{block.id}: {result['reason']}")
    if result["status"] == "fail":
        pytest.fail(
            f"{block.id} ({block.kind}) does not run as written: {result['reason']}\n"
            f"--- its output ---\n{result.get('output', '')}",
            pytrace=False,
        )


# The runner's own contract: what it accepts as printed and what it refuses.


@pytest.mark.parametrize(
    ("expected", "printed"),
    [
        ("0.960329 0.960636 0.960943", "0.96031 0.9606 0.96095\n"),
        ("(True, 8, 1)", "(True, 8, 1)"),
        ("[0.513 0.487]", "[0.5131 0.4869]"),
        (
            "strictly stable: largest eigenvalue -0.69018 < 0",
            "strictly stable: largest eigenvalue -0.690184 < 0",
        ),
        ("converged after ... [0.513 0.487]", "converged after 71 steps, t=67 [0.513 0.487]"),
        ("1.08e-07", "1.0801e-07"),
        ("solver dopri5, 12 steps", "solver dopri5, 12 steps"),
        ("0.960329... 0.9606...", "0.9603291854175084 0.9606458633211481"),
    ],
)
def test_compare_accepts_what_the_page_shows(expected: str, printed: str) -> None:
    assert compare(expected, printed) is None


@pytest.mark.parametrize(
    ("expected", "printed", "why"),
    [
        ("0.960329", "0.9800", "printed 0.9800 where the page shows 0.960329"),
        ("(True, 8, 1)", "(True, 8, 2)", "printed 2 where the page shows 1"),
        ("71 steps", "72 steps", "printed 72 where the page shows 71"),
        ("converged", "failed", "the output differs from the page"),
        ("0.5 0.5", "0.5", "the output differs from the page"),
    ],
)
def test_compare_refuses_other_numbers_and_text(expected: str, printed: str, why: str) -> None:
    assert compare(expected, printed) == why


def test_parse_reads_markers_and_outputs(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\nprint(1)\n```\n\n```text\n1\n```\n\n"
        "% docs-runner: skip (needs a GPU)\n```bash\nwflow run\n```\n\n"
        "<!-- docs-runner: file my.toml -->\n```toml\n[run]\n```\n\n"
        "```\nwflow --version\n```\n\n```\nwflow/  the package\n```\n"
        "```python\n>>> 1 + 1\n2\n```\n"
    )
    blocks = parse_page(page, root=tmp_path)
    assert [(b.line, b.kind, b.skip, b.file, b.expected) for b in blocks] == [
        (3, "python", None, None, "1\n"),
        (12, "shell", "needs a GPU", None, None),
        (17, "file", None, "my.toml", None),
        (21, "shell", None, None, None),
        (28, "doctest", None, None, None),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "% docs-runner: skipped (typo)\n```python\nx = 1\n```\n",
        "% docs-runner: skip (no fence after)\nsome prose\n",
        "% docs-runner: skip (a text block)\n```text\nx\n```\n",
    ],
)
def test_parse_refuses_misplaced_or_unknown_markers(tmp_path: Path, text: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match="docs-runner marker"):
        parse_page(page, root=tmp_path)


if __name__ == "__main__":  # the process of one page (run_page)
    main(sys.argv[1])
