#!/usr/bin/python3
"""A gRPC client that is not ours: Python grpcio with stubs generated from the proto at test time.

Usage: python_client.py ADDRESS EXPECTED_JSON
EXPECTED_JSON holds {"dim", "k", "queries": [[...]], "ids": [[...]], "distances": [[...]],
"total_vectors"}. Exits 0 when the router's answers match, non-zero with a message otherwise.
Run from the repository root (the proto is read from proto/).
"""
import json
import struct
import subprocess
import sys
import tempfile


def generate_stubs(out_dir):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iproto",
                    f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                    "proto/knnserve/v1/retrieval.proto"], check=True)
    sys.path.insert(0, out_dir)


def main():
    address, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    with tempfile.TemporaryDirectory() as out_dir:
        generate_stubs(out_dir)
        import grpc
        from knnserve.v1 import retrieval_pb2 as pb
        from knnserve.v1 import retrieval_pb2_grpc as rpc

        stub = rpc.RetrievalStub(grpc.insecure_channel(address))
        info = stub.Info(pb.InfoRequest(), timeout=10)
        assert info.dim == expected["dim"], info
        assert info.total_vectors == expected["total_vectors"], info

        queries = expected["queries"]
        data = b"".join(struct.pack(f"<{len(row)}f", *row) for row in queries)
        request = pb.SearchRequest(
            queries=pb.Matrix(rows=len(queries), cols=expected["dim"], dtype=pb.DTYPE_FP32,
                              data=data),
            params=pb.SearchParams(k=expected["k"]), request_id="python")
        response = stub.Search(request, timeout=10)
        k = expected["k"]
        ids = [list(response.ids[r * k:(r + 1) * k]) for r in range(len(queries))]
        assert ids == expected["ids"], (ids, expected["ids"])
        for r, row in enumerate(expected["distances"]):
            for j, d in enumerate(row):
                assert abs(response.distances[r * k + j] - d) <= 1e-5 * max(1.0, abs(d))
        assert response.request_id == "python"
        assert response.coverage.shards_answered == response.coverage.shards_asked

        # A malformed request: INVALID_ARGUMENT with a reason.
        bad = pb.SearchRequest(queries=request.queries, params=pb.SearchParams(k=0))
        try:
            stub.Search(bad, timeout=10)
            raise AssertionError("k = 0 was accepted")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            assert "params.k" in error.details(), error.details()

        # A decoding session: the same query twice on one stream.
        steps = [pb.StreamRequest(setup=pb.SessionSetup(default_params=pb.SearchParams(k=k)))]
        steps += [pb.StreamRequest(step=pb.SearchRequest(queries=request.queries))] * 2
        answers = list(stub.SearchStream(iter(steps), timeout=10))
        assert len(answers) == 2, answers
        for answer in answers:
            assert answer.error_code == 0, answer.error_message
            assert list(answer.ids) == list(response.ids)
    print("python client: ok")


if __name__ == "__main__":
    main()
