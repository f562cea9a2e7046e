// Python grpcio (a gRPC implementation that is not ours) queries the router.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"

namespace knnserve::testing {
namespace {

constexpr int kDim = 8;

TEST(PythonClientTest, GrpcioQueriesTheRouter) {
  if (std::system("/usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-grpcio / python3-grpc-tools are not installed";
  }
  std::shared_ptr<const Datastore> data = MakeDatastore(90, kDim, 4, 17);
  std::vector<std::unique_ptr<TestShard>> shards;
  ShardMap map;
  std::vector<std::unique_ptr<SearchEngine>> engines = MakeShardEngines(data, 2);
  for (int s = 0; s < 2; ++s) {
    shards.push_back(std::make_unique<TestShard>(s, std::move(engines[s])));
    map[s] = {shards.back()->address()};
  }
  TestRouter router(map, FastRouterOptions());

  const int k = 5;
  SearchQuery query;
  query.queries = RandomQueries(3, kDim, 2);
  query.params.k = k;
  FlatEngine all(data, 0, data->num_sentences());
  ASSERT_OK_AND_ASSIGN(EngineResult expected, all.Search(query));
  nlohmann::json spec = {{"dim", kDim}, {"k", k}, {"total_vectors", data->keys.rows()}};
  for (int64_t r = 0; r < query.queries.rows(); ++r) {
    spec["queries"].push_back(
        std::vector<float>(query.queries.row(r), query.queries.row(r) + kDim));
    spec["ids"].push_back(
        std::vector<int64_t>(expected.neighbors.id_row(r), expected.neighbors.id_row(r) + k));
    spec["distances"].push_back(std::vector<float>(expected.neighbors.distance_row(r),
                                                   expected.neighbors.distance_row(r) + k));
  }
  char path[] = "/tmp/knnserve_python_client_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << spec.dump();
  const std::string command = absl::StrCat(
      "timeout 60 /usr/bin/python3 tests/server/python_client.py ", router.address(), " ", path);
  const int status = std::system(command.c_str());
  std::remove(path);
  EXPECT_EQ(status, 0) << command;
}

}  // namespace
}  // namespace knnserve::testing
