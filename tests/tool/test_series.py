"""Series file and patch parsing."""

from __future__ import annotations

import subprocess

import pytest

from tests.tool.helpers.repos import change_line_20
from vllm_overlay import series


def test_parses_headers_and_diff(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    (patch,) = series.load_series(project / "patches")
    assert patch.subject == "core: change line 20"
    assert patch.series == "demo"
    assert patch.tests == ["tests/patches/demo/test_demo.py"]
    assert patch.targets == ["vllm.core:value"]
    assert patch.touched_files == ["vllm/core.py"]


def test_patches_from_bytes_parse_all_but_the_ones_parsed_before(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    mails = series.read_series_bytes(project / "patches")
    broken = [(mails[0][0], b"not a patch\n"), (mails[0][0], mails[0][1])]
    with pytest.raises(series.SeriesError, match="no '---' line"):
        series.patches_from_bytes(project / "patches", broken)  # parsed now: refused at once
    first, second = series.patches_from_bytes(project / "patches", broken, parsed_before=1)
    assert second.subject == "core: change line 20" and first.raw == b"not a patch\n"
    with pytest.raises(series.SeriesError, match="no '---' line"):
        first.subject  # noqa: B018 (parsed on first use)
    (loaded,) = series.load_series(project / "patches")
    assert second == loaded and second.diff is not None


def test_series_file_syntax(tmp_path):
    (tmp_path / "series").write_text("# comment\n\na/one.patch -p1\nb/two.patch # trailing\n")
    assert [e.path for e in series.read_series(tmp_path)] == ["a/one.patch", "b/two.patch"]
    (tmp_path / "series").write_text("a/one.patch -p0\n")
    with pytest.raises(series.SeriesError, match="expected 'PATCH"):
        series.read_series(tmp_path)


def test_listed_but_missing_file(tmp_path):
    (tmp_path / "series").write_text("a/missing.patch\n")
    with pytest.raises(series.SeriesError, match="does not exist"):
        series.load_series(tmp_path)


def test_render_series_groups_by_series():
    text = series.render_series(["a/1.patch", "a/2.patch", "b/1.patch"])
    assert text.splitlines()[1:] == ["", "# a", "a/1.patch", "a/2.patch", "", "# b", "b/1.patch"]


def test_select(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    patches = series.load_series(project / "patches")
    assert series.select(patches, "demo") == patches
    assert series.select(patches, "core-change-line-20") == patches
    with pytest.raises(series.SeriesError):
        series.select(patches, "nope")


def test_select_several_keeps_series_order(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20", series="first")
    make_patch(upstream_dir, lambda t: (t / "vllm" / "extra.py").write_text("x = 1\n"), "add extra", series="second")
    make_patch(upstream_dir, lambda t: (t / "vllm" / "more.py").write_text("y = 1\n"), "add more", series="third")
    patches = series.load_series(project / "patches")
    assert [p.series for p in series.select(patches, ["third", "first"])] == ["first", "third"]
    assert series.select(patches, ["first", "first"]) == patches[:1]
    with pytest.raises(series.SeriesError, match="'nope'"):
        series.select(patches, ["first", "nope"])


def test_a_mail_git_mailinfo_cannot_read_is_a_series_error_naming_it(project, make_patch, upstream_dir, monkeypatch):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    real_run = subprocess.run

    def failing_mailinfo(argv, **kwargs):
        if argv[:2] == ["git", "mailinfo"]:  # git's own failure, as a broken git would give it
            return subprocess.CompletedProcess(argv, 128, b"", b"fatal: cannot read the mail\n")
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", failing_mailinfo)
    with pytest.raises(series.SeriesError, match=r"core-change-line-20.patch: git mailinfo cannot read .*fatal"):
        series.load_series(project / "patches")


def test_the_trailers_of_a_series_come_from_one_git_process_as_each_patch_reads_its_own(
    project, make_patch, upstream_dir, monkeypatch
):
    """``parse_all_trailers`` gives each patch what ``Patch.trailers`` gives it alone (git's parser:
    a folded value joined, a message without a trailer block empty), with one git process."""
    made = make_patch(upstream_dir, change_line_20, "core: change line 20")
    raw = made.read_bytes()
    folded = raw.replace(b"Series: demo\n", b"Series: demo\n  and more\n")
    text = raw.decode()
    bare = text.replace(text[text.index("Description: ") : text.index("\n---\n")], "No trailer block.").encode()

    def loaded() -> list[series.Patch]:
        return [series.Patch(path=made, name=f"demo/{n}.patch", raw=r) for n, r in enumerate((raw, folded, bare))]

    alone = [patch.trailers for patch in loaded()]
    together = loaded()
    for patch in together:
        patch.parsed()  # the mail's own git process (mailinfo), not counted below
    started: list[list[str]] = []
    real_run = subprocess.run

    def counted(argv: list[str], *args: object, **kwargs: object) -> subprocess.CompletedProcess:
        started.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    series.parse_all_trailers(together)
    assert [patch.trailers for patch in together] == alone
    assert [argv[:2] for argv in started] == [["git", "interpret-trailers"]]
    assert ("Series", "demo and more") in alone[1] and alone[2] == [] and ("Series", "demo") in alone[0]
