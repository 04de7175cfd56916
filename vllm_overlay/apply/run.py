"""One apply run: under the output's lock, answer from what the output (or its spare, or a kept
build) already holds, else build in a staging area and publish the tree in one step.

What a run reuses is decided here (``apply_record``, ``staging``, ``kept_builds``); applying and
committing the patches themselves is ``engine``'s. A refused, killed or interrupted run never
leaves a half-applied tree behind, and the next run removes whatever a killed one left.
"""

from __future__ import annotations

import contextlib
import shutil
import threading  # loaded with subprocess anyway
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_overlay import diskspace, faults, interrupts
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import record as apply_record
from vllm_overlay.apply import staging
from vllm_overlay.apply.classify import PatchResult
from vllm_overlay.apply.engine import (
    ApplyError,
    Interrupted,
    Options,
    Report,
    apply_after_shared,
    apply_from_upstream,
)
from vllm_overlay.series import Patch
from vllm_overlay.upstream.trees import Upstream

if TYPE_CHECKING:
    from vllm_overlay.apply import kept_builds
    from vllm_overlay.store import Store


def apply_series(
    patches: list[Patch],
    upstream: Upstream,
    store: Store,
    output: Path,
    options: Options,
    progress: Callable[[int, int, str], None] | None = None,
    publish_partial: bool = False,
    seed_base: Callable[[], str | None] | None = None,
    wait: bool = True,
    on_wait: Callable[[int | None], None] | None = None,
    partial: bool = False,
    inputs: apply_record.Inputs | None = None,
    before_replace: Callable[[], None] | None = None,
    reuse: bool = True,
    kept: kept_builds.KeptBuilds | None = None,
    verify_upstream: Callable[[], Upstream] | None = None,
) -> Report:
    """Apply ``patches`` onto ``upstream`` (from ``store``, the cache holding its import) into ``output``.

    The result is published only if every patch was accepted, unless ``publish_partial`` (used
    by the audit, which wants the accepted part for a range-diff) is set. ``seed_base`` returns
    the upstream commit the series was written for; it is called only when a patch does not
    apply cleanly, and the blobs a 3-way merge needs are then recreated (``seed_preimages``).
    Another run on the same output is waited for (``on_wait`` is told its pid) or, with ``wait``
    off, refused with staging.OutputBusy. Ctrl-C or SIGTERM raise Interrupted after the staging area is
    removed and the git processes still running are ended. ``partial`` marks a tree that holds a
    selection of the series (``--only``), so export never takes it for the whole series.

    With ``inputs`` (the lock, upstream and options of this run) the published tree records what
    it was built from (``apply_record``); a later run with the same inputs and patches whose
    output is untouched since answers from that record without rebuilding (``Report.unchanged``).
    ``before_replace`` is called under the output's lock before anything is built to replace it
    (it may raise to refuse: apply-patches checks there that no unexported work would be lost).
    ``reuse`` off builds from upstream whatever the output or the cache holds (the record is still
    written, and the build kept). With ``kept`` (the cache's builds of ``inputs``) a build that
    neither the output nor its spare serves starts from the kept build sharing the most leading
    patches, and every build of the whole series is kept there for the next (``kept_builds``).
    ``verify_upstream``, where given, is called before the upstream is checked out and returns it
    verified (apply-patches starts from a record and reads the upstream only if the run needs it).
    A git step that failed, GitPython's too, raises ``vllm_overlay.git.GitError``.
    """
    output = output.resolve()
    staging.check_replaceable(output)  # before anything is created beside it (OutputNotOurs)
    output.parent.mkdir(parents=True, exist_ok=True)
    # OutputBusy if another run holds the output's lock
    with gitcmd.gitpython_failures(), staging.output_lock(output, wait=wait, on_wait=on_wait):
        return _apply_locked(
            output,
            patches,
            upstream,
            store,
            options,
            progress,
            publish_partial,
            seed_base,
            partial,
            inputs,
            before_replace,
            reuse,
            kept,
            verify_upstream,
        )


def unchanged_report(
    output: Path,
    lock_sha256: str,
    upstream: dict[str, object],
    options: Options,
    mails: list[tuple[str, bytes]],
    wait: bool = True,
    on_wait: Callable[[int | None], None] | None = None,
) -> Report | None:
    """The report of a re-apply of the whole series that would rebuild nothing, from ``output``'s record alone.

    Answered before any upstream is obtained: ``upstream`` is the locked upstream as its import
    recorded it (``upstream_trees.imported_locked``), ``mails`` the patch files as read (name,
    bytes). Under the output's lock, as every apply: ``output`` must be a tree this tool published
    (OutputNotOurs otherwise), and a killed run's leftovers beside it are removed. None when
    anything differs, the output included (the caller then runs the whole apply, which may still
    reuse a prefix); nothing is written either way.
    """
    output = output.resolve()
    staging.check_replaceable(output)
    if not output.is_dir():
        return None
    with staging.output_lock(output, wait=wait, on_wait=on_wait):
        staging.check_replaceable(output)
        staging.remove_leftovers(output)
        flags = (options.allow_offset, options.allow_fuzz, options.three_way)
        answer = apply_record.unchanged_results(output, lock_sha256, upstream, flags, mails)
    if answer is None:
        return None
    recorded_upstream, results = answer
    return Report(Upstream(**recorded_upstream), str(output), results, published=True, unchanged=True)


def _apply_locked(
    output: Path,
    patches: list[Patch],
    upstream: Upstream,
    store: Store,
    options: Options,
    progress: Callable[[int, int, str], None] | None,
    publish_partial: bool,
    seed_base: Callable[[], str | None] | None,
    partial: bool = False,
    inputs: apply_record.Inputs | None = None,
    before_replace: Callable[[], None] | None = None,
    reuse: bool = True,
    kept: kept_builds.KeptBuilds | None = None,
    verify_upstream: Callable[[], Upstream] | None = None,
) -> Report:
    published = False
    area: staging.StagingArea | None = None
    check: _OutputCheck | None = None
    try:
        faults.phase("locked")
        staging.check_replaceable(output)  # again under the lock: another process may have written it
        staging.remove_leftovers(output)
        check = _OutputCheck(output, inputs, patches) if inputs and reuse else None
        if check and check.holds_all(patches) and check.reusable():
            return Report(upstream, str(output), check.results, published=True, unchanged=True)
        shared = _spare_prefix(output, inputs, patches) if inputs and reuse else []
        if check and shared:
            check.start()  # the output's git status runs while the spare is reset (another core)
        area = staging.create_staging(output)
        spare_ready = bool(shared) and _reset_spare(area, output, shared)
        if not (check and check.reusable()) and before_replace is not None:
            try:
                before_replace()  # an untouched output holds no work that is not in patches/
            except BaseException:
                if spare_ready:  # a refusal changes nothing: the spare, reset to a commit it holds, stays
                    staging.keep_spare(area.tree, output)
                raise
        results = None
        if spare_ready:
            results = apply_after_shared(area, shared, patches, upstream, options, progress, seed_base)
        on_spare = results is not None
        if results is None and kept is not None and inputs is not None and reuse:
            # The staging tree a clone of the upstream at the last commit the best kept build of these
            # inputs shares with the run (None: none serves): only the patches after it are applied.
            kept_shared = kept.check_out(area.tree, patches)
            if kept_shared:
                results = apply_after_shared(area, kept_shared, patches, upstream, options, progress, seed_base)
        if results is None:
            results = apply_from_upstream(
                area, patches, upstream, store, options, progress, seed_base, partial, verify_upstream
            )
        head = None
        if inputs is not None and all(r.accepted for r in results):
            head = apply_record.write(area.tree, inputs, patches, results)  # published with the tree, or not at all
            if kept is not None and not on_spare:
                # A build on the spare is not kept: the re-apply loop stays at its few git steps,
                # and the kept build it started from (or the spare's own) still serves a new output.
                kept.keep(area.tree)
        if publish_partial or all(r.accepted for r in results):
            with interrupts.deferred():  # a signal during publish arrives once ``published`` is true
                old = staging.publish(area, output, head)
                published = True
                if old is not None and apply_record.load(old) is not None:
                    staging.keep_spare(old, output)  # the next re-apply after a patch change starts from it
        return Report(upstream=upstream, output=str(output), results=results, published=published)
    except OSError as exc:  # the machine's, not a patch's: a full disk, a read-only file system
        where = f" ({exc.filename})" if exc.filename else ""
        state = "already holds the new tree" if published else "unchanged"
        raise ApplyError(f"cannot write beside {output}: {exc.strerror or exc}{where}; {output} {state}") from None
    except Exception as exc:
        # A git step that failed to write: git says "failed to write new configuration file
        # .../config.lock" or "could not write to ...", not that the disk is full. Asked here, before
        # the staging area is removed (which frees the space again).
        failed = gitcmd.failure(exc)
        said = str(failed) if failed is not None else None
        no_space = diskspace.full(output.parent, said) if said is not None else None
        if no_space is None:
            raise
        state = "already holds the new tree" if published else "unchanged"
        last = [line.strip() for line in said.splitlines() if line.strip()][-1:] or [said]  # one line: git's last
        raise ApplyError(f"cannot write beside {output}: {no_space} (git: {last[0]}); {output} {state}") from None
    except KeyboardInterrupt:
        interrupts.end_child_processes()
        raise Interrupted(output, published) from None
    finally:
        if check is not None:
            check.close()
        if area is not None:
            # A second Ctrl-C cuts only this tidy-up short (the next run finishes it); what was
            # published or interrupted is already decided.
            with contextlib.suppress(KeyboardInterrupt):
                area.remove()


class _OutputCheck:
    """Whether ``output`` is untouched since this tool published it, and the recorded results of the
    leading patches it holds (built from the run's inputs).

    The record is read at once; the ``git status`` that proves the tree untouched runs on first
    need (``reusable``) or, once ``start`` is called, in a thread of its own, so that a re-apply
    on the spare resets the spare while git reads the output (two trees, two cores). Nothing is
    built, published or refused before the answer is in: ``reusable`` waits for it.
    """

    def __init__(self, output: Path, inputs: apply_record.Inputs, patches: list[Patch]) -> None:
        self.output = output
        self.record = apply_record.load(output) if output.is_dir() else None
        self.results: list[PatchResult] = []
        self.recorded = 0
        self._answer: bool | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if self.record is None or not apply_record.same_inputs(self.record, inputs):
            return
        count = apply_record.same_prefix(self.record, patches)
        results = apply_record.results_of(self.record)[:count]
        if count and all(r.accepted and r.commit for r in results):
            self.results, self.recorded = results, len(self.record["patches"])

    def holds_all(self, patches: list[Patch]) -> bool:
        """The record says the output holds exactly ``patches`` (the run rebuilds nothing if it is untouched)."""
        return bool(self.results) and len(self.results) == len(patches) == self.recorded

    def start(self) -> None:
        if self.results and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="output-status", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._answer = apply_record.untouched(self.output, self.record, staging.published_head(self.output))
        except BaseException as exc:  # handed to the thread that waits (reusable)
            self._error = exc

    def reusable(self) -> bool:
        """True when the output holds ``results`` untouched (then it holds no work of the user's)."""
        if not self.results:
            return False
        if self._thread is not None:
            self._thread.join()
        elif self._answer is None and self._error is None:
            self._run()  # here, once
        if self._error is not None:
            raise self._error
        return bool(self._answer)

    def close(self) -> None:
        """Wait for a status still running (an interrupt ended its git process already)."""
        if self._thread is not None:
            self._thread.join(timeout=5)


def _spare_prefix(output: Path, inputs: apply_record.Inputs, patches: list[Patch]) -> list[PatchResult]:
    """The recorded results of the leading patches ``output``'s spare holds (empty: none, or a spare
    of other inputs, or one whose HEAD is off the tool's branch).

    Its working tree needs no check: ``_reset_spare`` resets it with ``git reset --hard``, which
    rewrites every tracked file that differs (git's own stat check, ctime included, as ``git
    status`` makes it), and ``git clean -ffdx``, which removes everything else; commits made in it
    are left behind by the reset. What it holds afterwards is the last shared patch's commit.
    """
    spare = staging.spare_path(output)
    record = apply_record.load(spare)
    if record is None or not apply_record.same_inputs(record, inputs) or not apply_record.on_branch(spare, record):
        return []
    count = apply_record.same_prefix(record, patches)
    results = apply_record.results_of(record)[:count]
    return results if all(r.accepted and r.commit for r in results) else []


def _reset_spare(area: staging.StagingArea, output: Path, shared: list[PatchResult]) -> bool:
    """Make ``output``'s spare the staging tree, reset to the last shared patch's commit (only the
    files the later patches touched are rewritten); ``_apply_after`` then re-applies the rest, and
    the result replaces ``output`` in one step as always. Commit ids are a full apply's: each
    depends only on the upstream, the patches before it and its own mail. False where there is no
    spare or git cannot reset it (the caller then builds otherwise; the spare is gone). Plain git
    processes: GitPython is imported only if a patch needs more than a clean stretch.
    """
    if not staging.take_spare(area, output):
        return False
    try:
        gitcmd.git(area.tree, "reset", "--hard", "--quiet", shared[-1].commit)
        gitcmd.git(area.tree, "clean", "-ffdxq")  # untracked and ignored files: a build from upstream has none
    except gitcmd.GitError:  # a stale index.lock, a broken repository
        shutil.rmtree(area.tree, ignore_errors=True)
        return False
    return True
