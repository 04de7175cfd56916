"""The CycloneDX SBOM: valid by the library's own schema validator, exactly the series as pedigree."""

from __future__ import annotations

import datetime as dt
import json

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import series
from vllm_overlay.image import sbom
from vllm_overlay.upstream import lock

CREATED = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


def _real_inputs():
    the_lock = lock.load(REPO_ROOT / "upstream.lock")
    patches = series.load_series(REPO_ROOT / "patches")
    return the_lock, patches


def _render(the_lock, patches) -> str:
    bom = sbom.build(the_lock, patches, series_sha256="ab" * 32, status_version="0.1.0", created=CREATED)
    return sbom.render(bom)


def test_sbom_of_the_real_series_is_valid_and_lists_every_patch():
    the_lock, patches = _real_inputs()
    text = _render(the_lock, patches)
    assert sbom.problems(text, [p.name for p in patches]) == []
    data = json.loads(text)
    (vllm,) = [c for c in data["components"] if c["name"] == "vllm"]
    assert vllm["version"] == the_lock.version and vllm["purl"] == f"pkg:pypi/vllm@{the_lock.version}"
    assert vllm["hashes"] == [{"alg": "SHA-256", "content": the_lock.sdist.sha256}]
    properties = {p["name"]: p["value"] for p in vllm["properties"]}
    for artifact in the_lock.wheels.values():
        assert properties[f"vllm-overlay:artifact:{artifact.filename}:sha256"] == artifact.sha256
    assert vllm["pedigree"]["commits"][0]["uid"] == the_lock.commit.removeprefix("g")
    diffs = {entry["resolves"][0]["id"]: entry["diff"]["text"]["content"] for entry in vllm["pedigree"]["patches"]}
    assert diffs == {p.name: p.raw.decode() for p in patches}  # the patch files themselves
    assert properties[sbom.SERIES_PROPERTY] == ",".join(p.name for p in patches)  # and their order
    assert {entry["type"] for entry in vllm["pedigree"]["patches"]} == {"unofficial"}
    assert any(c["name"] == "vllm-overlay-status" for c in data["components"])


def test_the_pedigree_note_says_where_the_order_is_and_claims_none_of_the_list():
    """CycloneDX (and the library) keep pedigree patches as a set: the note must not call the list ordered."""
    the_lock, patches = _real_inputs()
    (vllm,) = [c for c in json.loads(_render(the_lock, patches))["components"] if c["name"] == "vllm"]
    listed = [entry["resolves"][0]["id"] for entry in vllm["pedigree"]["patches"]]
    assert sorted(listed) == sorted(p.name for p in patches)
    assert listed != [p.name for p in patches]  # the real series is not in the library's order: the case at issue
    notes = vllm["pedigree"]["notes"]
    assert "in that order" not in notes and "not the apply order" in notes and sbom.SERIES_PROPERTY in notes


def test_sbom_is_reproducible():
    the_lock, patches = _real_inputs()
    assert _render(the_lock, patches) == _render(the_lock, patches)


def test_problems_name_a_missing_patch_and_a_schema_error():
    the_lock, patches = _real_inputs()
    text = _render(the_lock, patches[:-1])
    missing = sbom.problems(text, [p.name for p in patches])
    assert len(missing) == 2 and patches[-1].name in missing[0] and "is not the series order" in missing[1]
    reordered = [p.name for p in patches[:-1]][::-1]
    assert sbom.problems(text, reordered) == [
        f"{sbom.SERIES_PROPERTY} {','.join(reordered[::-1])!r} is not the series order"
    ]
    broken = json.loads(text)
    broken["components"][0]["type"] = "no-such-type"
    assert any(p.startswith("schema:") for p in sbom.problems(json.dumps(broken), [p.name for p in patches[:-1]]))


def test_problems_of_text_that_is_not_json():
    (problem,) = sbom.problems("Traceback (most recent call last):", [])
    assert problem.startswith("not JSON:")
