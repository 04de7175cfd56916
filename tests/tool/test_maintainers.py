"""maintainers.toml: who authors and signs off each series, and the errors that say what to write."""

from __future__ import annotations

import pytest

from vllm_overlay import maintainers
from vllm_overlay.errors import InputError

DEFAULT = "Seed maintainers <maintainers@example.org>"
ADA = "Ada Lovelace <ada@example.org>"


def _load(tmp_path, text, series=("demo", "beta")):
    path = tmp_path / maintainers.MAINTAINERS_FILE
    path.write_text(text)
    return maintainers.load(path, series)


def test_the_default_carries_every_series_and_an_override_its_own(tmp_path):
    found = _load(tmp_path, f'default = "{DEFAULT}"\n\n[series]\nbeta = "{ADA}"\n')
    assert found.of("demo") == DEFAULT
    assert found.of("beta") == ADA


def test_the_repositorys_file_names_one_maintainer_for_every_series():
    from tests.tool.helpers.repos import REPO_ROOT
    from vllm_overlay import series

    names = {entry.series for entry in series.read_series(REPO_ROOT / "patches")}
    found = maintainers.load(REPO_ROOT / maintainers.MAINTAINERS_FILE, names)
    assert found.default == "Seed 218b93c4 maintainers <maintainers@users.noreply.a-seed-218b93c4.example>"
    assert {found.of(name) for name in names} == {found.default}


def test_a_missing_file_says_what_to_write(tmp_path):
    path = tmp_path / maintainers.MAINTAINERS_FILE
    with pytest.raises(InputError) as refused:
        maintainers.load(path)
    assert str(refused.value) == (
        f"{path}: not found: it names who authors and signs off each series' patches; write "
        '`default = "Ada Lovelace <ada@example.org>"` there (README.md, Patch format)'
    )


def test_bad_toml_is_an_input_error_with_where(tmp_path):
    with pytest.raises(InputError, match=r"not valid TOML \(.*line 1.*\): correct it"):
        _load(tmp_path, f"default = {DEFAULT}\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('default = "Seed maintainers"\n', "default = 'Seed maintainers' is not an identity as git writes one"),
        ('default = "<a@example.org>"\n', "default = '<a@example.org>' is not an identity"),
        ('default = "A <a@example.org> "\n', "default = 'A <a@example.org> ' is not an identity"),
        ('default = "A <not an address>"\n', "is not an identity"),
        ("default = 3\n", "default = 3 is not an identity"),
        (f'default = "{DEFAULT}"\n[series]\ndemo = "Ada"\n', "[series] demo = 'Ada' is not an identity"),
        (f'default = "{DEFAULT}"\nseries = "{ADA}"\n', "series must be a table"),
        (f'[series]\ndemo = "{ADA}"\n', 'no default maintainer: write `default = "Ada Lovelace'),
        (f'defualt = "{DEFAULT}"\n', "unknown key 'defualt'"),
    ],
)
def test_what_is_not_a_maintainer_is_refused_naming_the_fix(tmp_path, text, said):
    with pytest.raises(InputError) as refused:
        _load(tmp_path, text)
    assert said in str(refused.value)


def test_an_override_of_a_series_that_does_not_exist_is_refused(tmp_path):
    with pytest.raises(InputError) as refused:
        _load(tmp_path, f'default = "{DEFAULT}"\n[series]\nroute-sanitisation = "{ADA}"\n')
    assert str(refused.value).endswith(
        "[series] 'route-sanitisation' is no series of patches/series (its series: beta, demo): "
        "correct the name or remove the line"
    )
