"""The image's CycloneDX SBOM: vLLM as the lock names it, with every carried patch as its pedigree.

Scanners and auditors read a CycloneDX document, not this project's manifest. The vllm component
says exactly which release it is (version, purl, the sdist's sha256 as its hash, each wheel's
sha256 as a property, the release commit in its pedigree) and that it is *modified*: one pedigree
patch per entry of patches/series (their order in the ``vllm-overlay:series`` property), with the
patch file as its diff and the upstream links its Forwarded/Bug trailers give as what it resolves.
The status package that ships the manifest is a second component.

Reproducible like the image's layers: the serial number is derived from the inputs and the
timestamp is the image's SOURCE_DATE_EPOCH, so the same inputs give the same bytes.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence

from cyclonedx.model import AttachedText, HashAlgorithm, HashType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import (
    Commit,
    Component,
    ComponentType,
    Diff,
    PatchClassification,
    Pedigree,
)
from cyclonedx.model.component import (
    Patch as CdxPatch,
)
from cyclonedx.model.issue import IssueClassification, IssueType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from vllm_overlay.series import Patch
from vllm_overlay.upstream.lock import Lock

FILENAME = "sbom.cdx.json"
SERIES_PROPERTY = "vllm-overlay:series"
SCHEMA = SchemaVersion.V1_6
# What a reader of the pedigree must know: its patches are a set, their apply order is the property.
PEDIGREE_NOTES = (
    "patched by vllm-overlay: one pedigree patch per entry of patches/series. CycloneDX keeps pedigree "
    f"patches as a set, so their order here is not the apply order: the {SERIES_PROPERTY} property of "
    "this component lists the patches (the id each one resolves) in the order they are applied"
)
# The namespace of the derived serial numbers (uuid5 of the series sha256 and the lock).
_NAMESPACE = uuid.UUID("5f0c1a52-4c7e-5e2a-9a57-6f7665726c61")


def build(
    lock: Lock,
    patches: Sequence[Patch],
    *,
    series_sha256: str,
    status_version: str,
    created: dt.datetime,
) -> Bom:
    """The SBOM for the series applied on the locked release."""
    vllm = Component(
        name=lock.project,
        version=lock.version,
        type=ComponentType.LIBRARY,
        bom_ref=f"pkg:pypi/{lock.project}@{lock.version}",
        purl=PackageURL(type="pypi", name=lock.project, version=lock.version),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=lock.sdist.sha256)],
        properties=[
            Property(name=f"vllm-overlay:artifact:{lock.sdist.filename}:sha256", value=lock.sdist.sha256),
            *(
                Property(name=f"vllm-overlay:artifact:{artifact.filename}:sha256", value=artifact.sha256)
                for _, artifact in sorted(lock.wheels.items())
            ),
            Property(name="vllm-overlay:series-sha256", value=series_sha256),
            # CycloneDX keeps pedigree patches as a set (the library sorts them): the order lives here.
            Property(name=SERIES_PROPERTY, value=",".join(patch.name for patch in patches)),
        ],
        pedigree=Pedigree(
            commits=[Commit(uid=lock.commit.removeprefix("g"), message=f"{lock.project} {lock.version} release")],
            patches=[_pedigree_patch(patch) for patch in patches],
            notes=PEDIGREE_NOTES,
        ),
    )
    status = Component(
        name="vllm-overlay-status",
        version=status_version,
        type=ComponentType.LIBRARY,
        bom_ref=f"pkg:generic/vllm-overlay-status@{status_version}",
        description="provenance package shipped beside vllm: manifest, verify, plugin, this SBOM",
    )
    serial = uuid.uuid5(_NAMESPACE, f"{series_sha256}\0{lock.sdist.sha256}\0{status_version}")
    return Bom(
        serial_number=serial,
        metadata=BomMetaData(timestamp=created),
        components=[vllm, status],
    )


def _pedigree_patch(patch: Patch) -> CdxPatch:
    links = [value for key in ("Forwarded", "Bug") for value in patch.values(key) if "://" in value]
    return CdxPatch(
        type=PatchClassification.BACKPORT if patch.value("Applied-Upstream") else PatchClassification.UNOFFICIAL,
        diff=Diff(text=AttachedText(content=patch.raw.decode("utf-8"), content_type="text/x-diff")),
        resolves=[
            IssueType(
                type=IssueClassification.DEFECT,
                id=patch.name,
                name=patch.subject,
                description=patch.value("Description") or patch.subject,
                references=[XsUri(link) for link in links] or None,
            )
        ],
    )


def render(bom: Bom) -> str:
    """Deterministic JSON (sorted keys, trailing newline)."""
    text = JsonV1Dot6(bom).output_as_string()
    return json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def problems(text: str, patch_names: Sequence[str]) -> list[str]:
    """Schema errors of an SBOM, and any difference between its patches and the series' (in order)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"not JSON: {exc}"]
    # Imported here: the schema validator compiles its URI grammars on import (seconds of CPU),
    # which only a check of an SBOM should pay, not every command that imports this module.
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SCHEMA).validate_str(text, all_errors=True)
    found = [f"schema: {error}" for error in (errors or [])]
    vllm = next((c for c in data.get("components", []) if c.get("name") == "vllm"), None)
    if vllm is None:
        return [*found, "no vllm component"]
    listed = [
        issue.get("id") for entry in vllm.get("pedigree", {}).get("patches", []) for issue in entry.get("resolves", [])
    ]
    if sorted(listed) != sorted(patch_names):
        found.append(f"pedigree patches {sorted(listed)} are not the series' {sorted(patch_names)}")
    order = next((p["value"] for p in vllm.get("properties", []) if p.get("name") == SERIES_PROPERTY), "")
    if order.split(",") != list(patch_names):
        found.append(f"{SERIES_PROPERTY} {order!r} is not the series order")
    return found
