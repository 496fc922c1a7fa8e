"""Server reflection: any gRPC client can discover the API and call it without our generated code."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from api.process import RunningApi
from client.cli import channel
from tests.api.conftest import Client, deploy_job


async def reflect(
    stub: reflection_pb2_grpc.ServerReflectionStub, request: reflection_pb2.ServerReflectionRequest
) -> list[reflection_pb2.ServerReflectionResponse]:
    return [response async for response in stub.ServerReflectionInfo(iter([request]))]


async def test_reflection_lists_the_services_without_a_token(api: RunningApi) -> None:
    async with channel(f"127.0.0.1:{api.port}", None) as chan:
        stub = reflection_pb2_grpc.ServerReflectionStub(chan)
        [listed] = await reflect(stub, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {"runplane.v1.JobService", "runplane.v1.RunService", "grpc.health.v1.Health"} <= names


async def test_a_client_built_from_reflection_alone_triggers_and_reads_a_run(api: RunningApi, client: Client) -> None:
    job = await client.jobs.CreateJob(deploy_job())
    async with channel(f"127.0.0.1:{api.port}", client.token) as chan:
        stub = reflection_pb2_grpc.ServerReflectionStub(chan)
        pool = descriptor_pool.DescriptorPool()
        pending = [reflection_pb2.ServerReflectionRequest(file_containing_symbol="runplane.v1.RunService")]
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        while pending:
            for response in await reflect(stub, pending.pop()):
                for raw in response.file_descriptor_response.file_descriptor_proto:
                    proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
                    files.setdefault(proto.name, proto)
            for proto in list(files.values()):
                for dependency in proto.dependency:
                    if dependency not in files:
                        pending.append(reflection_pb2.ServerReflectionRequest(file_by_filename=dependency))
        added: set[str] = set()
        for _ in files:  # dependencies first; one more file at least per pass
            for name, proto in files.items():
                if name not in added and all(d in added for d in proto.dependency):
                    pool.Add(proto)
                    added.add(name)
        assert added == set(files) and "google/protobuf/timestamp.proto" in added
        service = pool.FindServiceByName("runplane.v1.RunService")

        # The message classes are made at run time from the reflected descriptors: no stub knows their fields.
        async def call(method_name: str, **fields: object) -> Any:
            method = service.FindMethodByName(method_name)
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            rpc = chan.unary_unary(
                f"/{service.full_name}/{method_name}",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_class.FromString,
            )
            return await rpc(request_class(**fields))

        triggered = await call("TriggerRun", job_id=job.id)
        assert triggered.status == 1  # queued
        fetched = await call("GetRun", run_id=triggered.id)
        assert fetched.id == triggered.id and fetched.job_id == job.id
