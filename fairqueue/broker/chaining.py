"""The BullMQ worker fairqueue's workers run: BullMQ's Python ``Worker``, except that a
slot finishing a job takes its next one in the same script call.

BullMQ's ``moveToFinished`` script can fetch the next job when it completes one
(``fetchNext``, what BullMQ's Node worker does after every job); the Python worker
never asks for it, so each job costs it a second round trip (``moveToActive``) and a
second trip through its loop. :class:`ChainingWorker` asks for it: a slot's task runs
the jobs that finishing hands it, one after another, until a finish hands it none (an
empty, paused or rate-limited queue, or a closing worker). The scripts, locks, lock
renewal, stalled check, attempts and backoff are BullMQ's own, unchanged; a failed job
is moved to failed as before, without fetching.

Closing: once ``close()`` or :meth:`ChainingWorker.stop_fetching` starts, no finish
fetches; a job a finish already fetched (the call was under way) is run in its slot like
any active job, and ``close()`` waits for it.
"""

from __future__ import annotations

import time
from typing import Any

from bullmq import Job as BullJob
from bullmq import Worker as BullWorker
from bullmq.custom_errors import DelayedError, UnrecoverableError, WaitingChildrenError


class ChainingWorker(BullWorker):
    """``bullmq.Worker`` whose job completion fetches the slot's next job (see the
    module)."""

    #: Whether a completion may fetch; :meth:`stop_fetching` turns it off at once.
    fetching: bool = True

    def stop_fetching(self) -> None:
        """Fetch no more on completion, from now on: ``close()`` says so only once its
        task runs, and a completion under way before then would take one more job (a
        recycled process running a job past its ``--max-jobs-per-child``)."""
        self.fetching = False

    async def processJob(self, job: BullJob, token: str) -> None:  # noqa: N802 - BullMQ's name
        """Run ``job``, then each job its completion fetched, in this slot."""
        next_job: BullJob | None = job
        while next_job is not None:
            next_job = await self._run_one(next_job, token)

    async def _run_one(self, job: BullJob, token: str) -> BullJob | None:
        """BullMQ's ``Worker.processJob`` (bullmq 3.4), its completion asking for the
        next job unless the worker is closing; returns that job (locked with ``token``,
        active), or ``None``."""
        fetched: Any = None
        try:
            if "removeOnComplete" not in job.opts and "removeOnComplete" in self.opts:
                job.opts["removeOnComplete"] = self.opts["removeOnComplete"]
            if "removeOnFail" not in job.opts and "removeOnFail" in self.opts:
                job.opts["removeOnFail"] = self.opts["removeOnFail"]
            self.jobs.add((job, token))
            controller = self.lockManager.track_job(
                job.id,
                token,
                int(time.time() * 1000),
                should_create_controller=self._processor_wants_signal,
            )
            if job.deferredFailure:
                await job.moveToFailed(UnrecoverableError(job.deferredFailure), token)
                self.emit("failed", job, UnrecoverableError(job.deferredFailure))
                return None
            if controller is not None:
                result = await self.processor(job, token, controller.signal)
            else:
                result = await self.processor(job, token)
            if not self.forceClosing:
                fetch = self.fetching and not self.closing
                finished = await self.backend.moveToCompleted(
                    job, result, job.opts.get("removeOnComplete", False), token, fetch_next=fetch
                )
                job.returnvalue = result
                job.attemptsMade = job.attemptsMade + 1
                if fetch and isinstance(finished, dict):
                    fetched = finished.get("result")
            self.emit("completed", job, result)
        except (DelayedError, WaitingChildrenError):
            return None
        except Exception as err:
            try:
                if not self.forceClosing:
                    await job.moveToFailed(err, token)
                self.emit("failed", job, err)
            except Exception as failed_err:
                self.emit("error", failed_err, job)
        finally:
            self.jobs.discard((job, token))
            self.lockManager.untrack_job(job.id)
        return await self._fetched(fetched, token)

    async def _fetched(self, fetched: Any, token: str) -> BullJob | None:
        """The job a completion fetched, as ``moveToActive`` would have given it (and
        the worker's drained and delay state, as after ``moveToActive``)."""
        if not isinstance(fetched, list | tuple) or len(fetched) != 4:
            return None
        job_data, job_id, limit_until, delay_until = fetched
        next_job = await self.nextJobFromJobData(
            job_data, job_id, limit_until or 0, delay_until or 0, token
        )
        if next_job is not None:
            self.emit("active", next_job, "waiting")
        return next_job
