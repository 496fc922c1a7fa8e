"""Every RunnerService call fuzzed against a real API process: clear status codes, nothing half-written.

Calls are drawn with right and wrong tokens (its own, another run's, made up, none), right and wrong
run ids and lease ids, huge and odd log chunks, steps out of order, artifact paths that try to leave
the work directory, and every status. After each call: the answer is OK or one of the codes the
contract names (never INTERNAL or UNKNOWN); a refused call changed nothing about either run; an
accepted one changed exactly what it says.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runplane.basics.tokens import new_run_token
from runplane.v1 import runner_pb2, runner_pb2_grpc
from tests.support.processes import Services, wait_for_port
from tests.support.records import Conn, create_account, create_job, make_starting, queue_run, rows, run_row

pytestmark = pytest.mark.slow

LEASE = "fuzz-runner"
EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a message over the transport's size limit
}
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)


SNAPSHOT_QUERIES = (
    "SELECT step_index, status, exit_code, started_at IS NOT NULL AS s FROM run_steps WHERE run_id = %s ORDER BY 1",
    "SELECT seq, step_index, md5(text) AS t FROM run_log_chunks WHERE run_id = %s ORDER BY seq",
    "SELECT path, step_index, md5(content) AS c FROM artifacts WHERE run_id = %s ORDER BY path",
)


def snapshot(db: Conn, run_id: int) -> str:
    """Everything a runner can change about a run (but its lease's clock), as one comparable text."""
    row = run_row(db, run_id)
    parts: list[Any] = [{k: str(v) for k, v in row.items() if k not in ("heartbeat_at", "lease_expires_at")}]
    for query in SNAPSHOT_QUERIES:
        parts.append([{k: str(v) for k, v in r.items()} for r in rows(db, query, (run_id,))])
    return json.dumps(parts, sort_keys=True)


def test_fuzz_every_call(db: Conn, services: Services) -> None:
    services.start("api", name="api")
    address = services.env["RUNPLANE_RUNNER__API_ADDRESS"]
    wait_for_port(address)
    account = create_account(db)
    runs = []
    for _ in range(2):
        run_id = queue_run(db, create_job(db, account, steps=["one", "two", "three"]))
        runs.append((run_id, make_starting(db, run_id)))
    (mine, my_token), (theirs, their_token) = runs
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    for run_id, token in runs:
        stub.Claim(
            runner_pb2.ClaimRequest(run_id=run_id, lease_id=LEASE), metadata=(("authorization", f"Bearer {token}"),)
        )

    tokens = st.sampled_from([my_token, my_token, my_token, their_token, new_run_token(), "", "Basic abc"])
    run_ids = st.sampled_from([mine, mine, mine, theirs, 0, -1, 2**62])
    leases = st.sampled_from([LEASE, LEASE, LEASE, "someone-else", "", "x" * 300])
    indexes = st.sampled_from([0, 1, 2, 3, -1, 2**31 - 1])
    statuses = st.sampled_from([0, 1, 2, 3, 10, 20, 30, 99])
    texts = st.one_of(SAFE_TEXT, st.sampled_from(["a\x00b", "x" * (1024 * 1024), "y" * (1024 * 1024 + 1)]))
    chunk = st.builds(
        runner_pb2.RunnerLogChunk,
        seq=st.sampled_from([1, 2, 3, 0, -5, 2**62]),
        step_index=indexes,
        text=texts,
    )
    paths = st.sampled_from(
        ["target/run_results.json", "manifest.json", "../escape", "/etc/passwd", "a/../../b", "", "."]
    )
    contents = st.sampled_from([b"{}", b"", b"\x00\xff", b"z" * (65 * 1024 * 1024)])

    calls = st.one_of(
        st.builds(lambda r, lease: ("Claim", runner_pb2.ClaimRequest(run_id=r, lease_id=lease)), run_ids, leases),
        st.builds(lambda r, lease: ("RenewLease", runner_pb2.LeaseRequest(run_id=r, lease_id=lease)), run_ids, leases),
        st.builds(lambda r, lease: ("ReadCancel", runner_pb2.LeaseRequest(run_id=r, lease_id=lease)), run_ids, leases),
        st.builds(
            lambda r, lease, c: ("AppendLogs", runner_pb2.AppendLogsRequest(run_id=r, lease_id=lease, chunks=c)),
            run_ids,
            leases,
            st.lists(chunk, max_size=4),
        ),
        st.builds(
            lambda r, lease, i, s, st_, e: (
                "SetStepStatus",
                runner_pb2.SetStepStatusRequest(
                    run_id=r, lease_id=lease, step_index=i, state=s, status=st_, exit_code=e
                ),
            ),
            run_ids,
            leases,
            indexes,
            st.sampled_from([0, 1, 2, 3, 7]),
            statuses,
            st.sampled_from([0, 1, 137]),
        ),
        st.builds(
            lambda r, lease, i, p, c: (
                "UploadArtifact",
                runner_pb2.UploadArtifactRequest(run_id=r, lease_id=lease, step_index=i, path=p, content=c),
            ),
            run_ids,
            leases,
            indexes,
            paths,
            contents,
        ),
        st.builds(
            lambda r, lease, s, f: ("Finish", runner_pb2.FinishRequest(run_id=r, lease_id=lease, status=s, failure=f)),
            run_ids,
            leases,
            statuses,
            st.sampled_from([0, 1, 2, 5]),
        ),
    )
    seen: set[grpc.StatusCode] = set()
    owner = {my_token: mine, their_token: theirs}

    @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call=calls, token=tokens)
    def one_call(call: tuple[str, Any], token: str) -> None:
        name, request = call
        metadata = (("authorization", token if " " in token else f"Bearer {token}"),) if token else ()
        before = {run_id: snapshot(db, run_id) for run_id in (mine, theirs)}
        try:
            getattr(stub, name)(request, metadata=metadata, timeout=30)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            assert code in EXPECTED, (name, code, exc.details())
        seen.add(code)
        after = {run_id: snapshot(db, run_id) for run_id in (mine, theirs)}
        if code is not grpc.StatusCode.OK:
            assert after == before, (name, code)  # a refused call wrote nothing
            return
        # Accepted: only with the token of the run it names; the other run is untouched.
        assert owner.get(token) == request.run_id, (name, request.run_id)
        untouched = theirs if request.run_id == mine else mine
        assert after[untouched] == before[untouched]
        if name == "AppendLogs":
            query = "SELECT seq FROM run_log_chunks WHERE run_id = %s"
            stored = {r["seq"] for r in rows(db, query, (request.run_id,))}
            assert all(c.seq in stored for c in request.chunks)
        if name == "Finish":
            assert run_row(db, request.run_id)["status"] == request.status

    try:
        one_call()
    finally:
        channel.close()
    # The fuzzing reached both sides of the contract.
    assert grpc.StatusCode.OK in seen and grpc.StatusCode.PERMISSION_DENIED in seen
    assert grpc.StatusCode.INVALID_ARGUMENT in seen or grpc.StatusCode.FAILED_PRECONDITION in seen
