// The real processes: knnserve-shard over index directories built by the index layer, and
// knnserve-router in front of them. Router answers equal an in-process search of the unsharded
// index (Flat exactly; IVFPQ ids and distances), subset search, SIGTERM drain, and
// deploy/local/up.sh + down.sh.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/datastore/key_source.h"
#include "common/index/builder.h"
#include "common/index/index_engine.h"
#include "common/index/manifest.h"
#include "common/status_matchers.h"
#include "common/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/server/test_cluster.h"
#include "tests/testing/neighbors.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::testing {
namespace {

constexpr int kDim = 16;
constexpr int64_t kVectors = 6000;
constexpr int kShards = 3;

std::string Bin(const std::string& name) { return absl::StrCat(KNNSERVE_BIN_DIR, "/", name); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A child process with stdout and stderr in a log file; killed when destroyed.
class Process {
 public:
  Process(const std::vector<std::string>& argv, std::string log) : log_(std::move(log)) {
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Process() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // The value of `field` in the first log line whose msg is `msg`, waiting up to `timeout`.
  std::string WaitForLog(const std::string& msg, const std::string& field,
                         absl::Duration timeout = absl::Seconds(60)) const {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      std::istringstream lines(ReadFile(log_));
      for (std::string line; std::getline(lines, line);) {
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j.value("msg", "") == msg) {
          return j.contains(field) ? j[field].dump() : "";
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "no '" << msg << "' in " << log_ << ":\n" << ReadFile(log_);
    return "";
  }
  std::string Address() const {
    const std::string quoted = WaitForLog("listening", "address");
    return quoted.size() > 2 ? quoted.substr(1, quoted.size() - 2) : "";
  }

  void Signal(int signal) const { kill(pid_, signal); }
  // The exit status, or -1 if still running after `timeout`.
  int Wait(absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return -1;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

struct Index {
  Matrix<float> keys;
  DatastoreValues values;
};

const Index& Data() {
  static const Index* index = [] {
    auto* data = new Index{Matrix<float>(kVectors, kDim), {}};
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < data->keys.size(); ++i) data->keys.data()[i] = normal(rng);
    std::uniform_int_distribution<int> length(1, 12);
    data->values.offsets.push_back(0);
    while (data->values.offsets.back() < kVectors) {
      data->values.offsets.push_back(
          std::min<int64_t>(kVectors, data->values.offsets.back() + length(rng)));
    }
    for (int64_t i = 0; i < kVectors; ++i) data->values.tokens.push_back(i % 997);
    return data;
  }();
  return *index;
}

std::string BuildIndexDir(const std::string& name, const std::string& factory, int shards) {
  const std::string dir = testing::FreshTempDir("service_" + name).string();
  IndexBuildOptions options;
  options.factory = factory;
  options.shards = shards;
  options.threads = 1;  // 2-core CI machines: OpenMP threads only contend
  options.progress.out = nullptr;
  options.progress.interactive = 0;
  MatrixKeySource keys(Data().keys.view());
  const MemoryValueSource values(Data().values);
  EXPECT_THAT(BuildIndex(keys, &values, options, dir), IsOk());
  return dir;
}

// Shard processes for every shard of `dir` and a router process in front of them.
class ProcessCluster {
 public:
  ProcessCluster(const std::string& dir, int shards, const std::string& name,
                 const std::vector<std::string>& shard_flags = {}) {
    std::string map;
    for (int s = 0; s < shards; ++s) {
      std::vector<std::string> argv = {Bin("knnserve-shard"), "--index",  dir,          "--shard",
                                       absl::StrCat(s),       "--listen", "127.0.0.1:0"};
      argv.insert(argv.end(), shard_flags.begin(), shard_flags.end());
      shards_.push_back(
          std::make_unique<Process>(argv, absl::StrCat(dir, "/", name, "_shard", s, ".log")));
    }
    for (int s = 0; s < shards; ++s) {
      absl::StrAppend(&map, s, " ", shards_[s]->Address(), "\n");
    }
    const std::string map_file = absl::StrCat(dir, "/", name, "_shards.txt");
    std::ofstream(map_file) << map;
    router_ = std::make_unique<Process>(
        std::vector<std::string>{Bin("knnserve-router"), "--shards", map_file, "--listen",
                                 "127.0.0.1:0", "--probe-interval-ms", "100"},
        absl::StrCat(dir, "/", name, "_router.log"));
    address_ = router_->Address();
    router_->WaitForLog("serving", "msg");
  }

  const std::string& address() const { return address_; }
  Process& shard(int s) { return *shards_[s]; }
  Process& router() { return *router_; }

 private:
  std::vector<std::unique_ptr<Process>> shards_;
  std::unique_ptr<Process> router_;
  std::string address_;
};

Matrix<float> Queries(int64_t rows, uint32_t seed) { return RandomQueries(rows, kDim, seed); }

void ExpectEqualsEngine(const v1::SearchResponse& response, const SearchEngine& engine,
                        const SearchQuery& query) {
  ASSERT_OK_AND_ASSIGN(EngineResult expected, engine.Search(query));
  ASSERT_OK_AND_ASSIGN(Neighbors got, DecodeNeighbors(response));
  testing::ExpectSameNeighborsUpToRounding(expected.neighbors, got);
  EXPECT_EQ(got.values, expected.neighbors.values);
}

// A subset search through `stub` (rows: row_group.size() random queries from `seed`) answers as
// `engine` does.
void ExpectSubsetSearchEqualsEngine(v1::Retrieval::Stub* stub, const SearchEngine& engine,
                                    const SubsetGroups& groups,
                                    const std::vector<int32_t>& row_group, int k, uint32_t seed) {
  const Matrix<float> queries = Queries(static_cast<int64_t>(row_group.size()), seed);
  v1::SearchRequest request = MakeRequest(queries, k);
  for (const auto& group : groups) {
    request.add_subset_groups()->mutable_sentence_ids()->Assign(group.begin(), group.end());
  }
  request.mutable_row_group()->Assign(row_group.begin(), row_group.end());
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  SearchQuery query;
  query.queries = queries;
  query.params.k = k;
  query.subset_groups = std::make_shared<const SubsetGroups>(groups);
  query.row_group = row_group;
  ExpectEqualsEngine(response, engine, query);
}

class RouterProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RouterProcessTest, RouterEqualsInProcessSearchOfTheUnshardedIndex) {
  const std::string factory = GetParam();
  const std::string name = factory == "Flat" ? "flat" : "ivfpq";
  const std::string sharded = BuildIndexDir(name + "_sharded", factory, kShards);
  const std::string unsharded = BuildIndexDir(name + "_unsharded", factory, 1);
  ASSERT_OK_AND_ASSIGN(auto engine, CreateEngine(unsharded, 0, {.threads = 1}));
  ProcessCluster cluster(sharded, kShards, name);
  auto stub = Connect(cluster.address());

  const Matrix<float> queries = Queries(16, 3);
  for (int nprobe : {0, 4}) {
    SearchQuery query;
    query.queries = queries;
    query.params.k = 10;
    query.params.nprobe = nprobe;
    v1::SearchRequest request = MakeRequest(queries, 10);
    request.mutable_params()->set_nprobe(nprobe);
    v1::SearchResponse response;
    const grpc::Status status = CallSearch(stub.get(), request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ExpectEqualsEngine(response, *engine, query);
    EXPECT_EQ(response.coverage().shards_answered(), kShards);
    EXPECT_EQ(response.coverage().vectors_total(), kVectors);
  }
}

INSTANTIATE_TEST_SUITE_P(Factories, RouterProcessTest, ::testing::Values("Flat", "IVF32,PQ8"));

TEST(ProcessTest, SubsetSearchThroughTheRouterEqualsTheLocalEngine) {
  const std::string dir = BuildIndexDir("subset", "IVF32,PQ8", kShards);
  ASSERT_OK_AND_ASSIGN(auto local, CreateLocalEngine(dir, {.threads = 1}));
  ASSERT_TRUE(local->info().num_sentences > 0);
  ProcessCluster cluster(dir, kShards, "subset");
  auto stub = Connect(cluster.address());
  const int64_t sentences = local->info().num_sentences;
  ExpectSubsetSearchEqualsEngine(stub.get(), *local,
                                 {{0, 1, 2, sentences / 2}, {sentences - 1, sentences - 2}},
                                 {0, 0, 1, 1}, 5, 8);
}

TEST(ProcessTest, SubsetOnlyShardsAnswerSubsetsWithoutTheirFaissIndexAndRefuseFullSearches) {
  const std::string dir = BuildIndexDir("subset_only", "IVF32,PQ8", kShards);
  ASSERT_OK_AND_ASSIGN(auto local, CreateLocalEngine(dir, {.threads = 1}));
  ASSERT_OK_AND_ASSIGN(IndexManifest manifest, ReadManifest(dir));
  // Damaged faiss files: a shard that read one would refuse to start (DATA_LOSS).
  for (const ShardManifest& shard : manifest.shards) {
    std::ofstream(absl::StrCat(dir, "/", shard.index.file), std::ios::binary) << "damaged";
  }
  ProcessCluster cluster(dir, kShards, "subset_only", {"--subset-only"});
  auto stub = Connect(cluster.address());

  grpc::ClientContext info_context;
  v1::InfoResponse info;
  ASSERT_TRUE(stub->Info(&info_context, v1::InfoRequest(), &info).ok());
  EXPECT_TRUE(info.subset_only());
  EXPECT_TRUE(info.supports_subset());
  ASSERT_EQ(info.shards_size(), kShards);
  for (const v1::ShardInfo& shard : info.shards()) EXPECT_TRUE(shard.subset_only());

  const int64_t sentences = local->info().num_sentences;
  ExpectSubsetSearchEqualsEngine(stub.get(), *local, {{3, sentences / 2, sentences - 1}}, {0, 0, 0},
                                 6, 9);
  const Matrix<float> queries = Queries(3, 9);
  v1::SearchResponse response;

  // A full search: refused by the router, naming the shards, and by each shard itself.
  const grpc::Status full = CallSearch(stub.get(), MakeRequest(queries, 6), &response);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(full.error_message(),
              ::testing::HasSubstr("shards 0, 1, 2 serve subset searches only"));
  auto shard_stub = Connect(cluster.shard(1).Address());
  const grpc::Status direct = CallSearch(shard_stub.get(), MakeRequest(queries, 6), &response);
  EXPECT_EQ(direct.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(direct.error_message(), ::testing::HasSubstr("subset searches only"));
}

// Flags out of range, and flags that would be ignored (a hedge delay with hedging off, a TLS
// server name without TLS), stop a server at start naming the flag.
TEST(ProcessTest, ServersRefuseBadAndIgnoredFlagsAtStart) {
  const std::string out = testing::FreshTempDir("service_flags").string() + "/out.txt";
  for (const auto& [binary, flags, named] : std::vector<std::array<std::string, 3>>{
           {"knnserve-router", "--shards /dev/null --probe-interval-ms nan", "--probe-interval-ms"},
           {"knnserve-router", "--shards /dev/null --timeout-ms nan", "--timeout-ms"},
           {"knnserve-router", "--shards /dev/null --no-hedge --hedge-delay-ms 5",
            "--hedge-delay-ms"},
           {"knnserve-router", "--shards /dev/null --shard-tls-server-name shards.internal",
            "--shard-tls-server-name"},
           {"knnserve-shard", "--index /nonexistent --shard 0 --drain-seconds nan",
            "--drain-seconds"},
           {"knnserve-shard", "--index /nonexistent --shard 0 --stream-idle-seconds 0.5",
            "--stream-idle-seconds"},
           {"knnserve-shard", "--index /nonexistent --shard 0 --listen 127.0.0.1:99999",
            "--listen"}}) {
    const std::string command =
        absl::StrCat("timeout 30 ", Bin(binary), " ", flags, " > ", out, " 2>&1");
    EXPECT_NE(std::system(command.c_str()), 0) << command;
    EXPECT_THAT(ReadFile(out), ::testing::HasSubstr(named)) << command;
  }
}

// A router whose metrics port is taken exits 1 without serving (it crashed: its probes set the
// health of a server already gone).
TEST(ProcessTest, ARouterWhoseMetricsPortIsTakenExitsCleanly) {
  const int holder = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(holder, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string dir = testing::FreshTempDir("router_metrics_port").string();
  std::ofstream(dir + "/shards.txt") << "0 127.0.0.1:1\n";
  const std::string log = dir + "/router.log";
  for (int run = 0; run < 3; ++run) {
    const std::string command = absl::StrCat(
        "timeout 30 ", Bin("knnserve-router"), " --shards ", dir,
        "/shards.txt --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:", ntohs(address.sin_port),
        " > ", log, " 2>&1");
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << ReadFile(log);
    EXPECT_EQ(WEXITSTATUS(status), 1) << ReadFile(log);
    EXPECT_THAT(ReadFile(log), ::testing::HasSubstr("cannot serve metrics"));
    EXPECT_THAT(ReadFile(log), ::testing::Not(::testing::HasSubstr("\"msg\":\"serving\"")));
  }
  close(holder);
}

TEST(ProcessTest, SigtermDrainsAndExitsZero) {
  const std::string dir = BuildIndexDir("drain", "Flat", 2);
  ProcessCluster cluster(dir, 2, "drain");
  auto stub = Connect(cluster.address());
  v1::SearchResponse response;
  ASSERT_TRUE(CallSearch(stub.get(), MakeRequest(Queries(2, 1), 3), &response).ok());
  cluster.shard(1).Signal(SIGTERM);
  EXPECT_EQ(cluster.shard(1).Wait(absl::Seconds(30)), 0);
  // The router notices: without allow_partial the request names the missing shard.
  const grpc::Status status = CallSearch(stub.get(), MakeRequest(Queries(2, 1), 3), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("shard 1"));
  cluster.router().Signal(SIGTERM);
  EXPECT_EQ(cluster.router().Wait(absl::Seconds(30)), 0);
}

// A shard told to stop while it loads exits 0 at once, never having reported SERVING: its
// index file here is a FIFO nobody writes, so the load waits forever.
TEST(ProcessTest, SigtermWhileLoadingExitsAtOnce) {
  const std::string dir = BuildIndexDir("sigterm_loading", "Flat", 1);
  ASSERT_OK_AND_ASSIGN(IndexManifest manifest, ReadManifest(dir));
  const std::string file = absl::StrCat(dir, "/", manifest.shards[0].index.file);
  ASSERT_TRUE(std::filesystem::remove(file));
  ASSERT_EQ(mkfifo(file.c_str(), 0644), 0);
  const std::string log = dir + "/shard.log";
  Process shard({Bin("knnserve-shard"), "--index", dir, "--shard", "0", "--listen", "127.0.0.1:0"},
                log);
  shard.Address();
  absl::SleepFor(absl::Milliseconds(200));
  shard.Signal(SIGTERM);
  EXPECT_EQ(shard.Wait(absl::Seconds(20)), 0) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), ::testing::HasSubstr("\"msg\":\"stopped while loading\""));
  EXPECT_THAT(ReadFile(log), ::testing::Not(::testing::HasSubstr("\"msg\":\"serving\"")));
}

TEST(ProcessTest, LocalUpAndDownScripts) {
  const std::string dir = BuildIndexDir("up", "Flat", 2);
  const std::string run_dir = absl::StrCat(dir, "/run");
  const std::string out = absl::StrCat(dir, "/up.out");
  const std::string up =
      absl::StrCat("KNNSERVE_BIN=", KNNSERVE_BIN_DIR, " KNNSERVE_UP_TIMEOUT=60 ",
                   "timeout 120 deploy/local/up.sh ", dir,
                   " -r 2 -p 16300 -s \"--batch-threads 1\" -d ", run_dir, " > ", out);
  ASSERT_EQ(std::system(up.c_str()), 0) << ReadFile(out);
  std::string address = ReadFile(out);
  address.erase(address.find_last_not_of('\n') + 1);
  EXPECT_EQ(address, "127.0.0.1:16300");
  auto stub = Connect(address);
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub.get(), MakeRequest(Queries(2, 1), 3), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.coverage().shards_answered(), 2);
  EXPECT_THAT(ReadFile(run_dir + "/shards.txt"), ::testing::HasSubstr("1 127.0.0.1:"));
  // The router's metrics, over HTTP on the port after its gRPC port.
  EXPECT_EQ(std::system("/usr/bin/python3 -c \"import urllib.request as u; "
                        "t = u.urlopen('http://127.0.0.1:16301/metrics', timeout=10).read(); "
                        "assert b'knnserve_shard_requests_total{shard=' in t\""),
            0);
  EXPECT_EQ(
      std::system(
          absl::StrCat("timeout 90 deploy/local/down.sh -d ", run_dir, " > /dev/null").c_str()),
      0);
}

// up.sh gives up as soon as a server exits (here: a flag it does not know), instead of waiting
// for a "serving" line until its timeout, and stops the servers it started.
TEST(ProcessTest, LocalUpFailsAtOnceWhenAServerExits) {
  const std::string dir = BuildIndexDir("up_exit", "Flat", 2);
  const std::string run_dir = absl::StrCat(dir, "/run");
  const std::string out = absl::StrCat(dir, "/up.out");
  const std::string up = absl::StrCat(
      "KNNSERVE_BIN=", KNNSERVE_BIN_DIR, " KNNSERVE_UP_TIMEOUT=600 timeout 60 deploy/local/up.sh ",
      dir, " -p 16320 -s --no-such-flag -d ", run_dir, " > ", out, " 2>&1");
  const int status = std::system(up.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << ReadFile(out);  // 124: timeout(1) ended it
  EXPECT_THAT(ReadFile(out), ::testing::HasSubstr("exited"));
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/pids"));
}

// A pids file outlives its cluster (a reboot, a killed script); by then a listed PID may name
// another process. down.sh signals only processes whose start time is the one recorded: were it
// to signal this test's own PID, listed with another start time, the test would die.
TEST(ProcessTest, LocalDownLeavesAProcessThatReusedAListedPid) {
  const std::string run_dir = testing::FreshTempDir("down_stale").string();
  std::ofstream(run_dir + "/pids") << ::getpid() << " 1\n";
  const std::string down = absl::StrCat("timeout 30 deploy/local/down.sh -d ", run_dir, " > ",
                                        run_dir, "/down.out 2>&1");
  EXPECT_EQ(std::system(down.c_str()), 0) << ReadFile(run_dir + "/down.out");
  EXPECT_THAT(ReadFile(run_dir + "/down.out"), ::testing::HasSubstr("stopped 0 processes"));
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/pids"));
}

// The pods of deploy/kubernetes/render.py's manifests (2 shards x 2 replicas and a router), run
// here as tests/deploy/local_pods.py plans them: the manifests pass its checks, the router
// reaches every replica through the shard map's pod names, the answers equal the unsharded
// index's, and a lost shard pod is covered by its replica.
TEST(KubernetesManifests, PodsServeTheIndexAndSurviveALostShardPod) {
  if (std::system("/usr/bin/python3 -c 'import yaml' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-yaml is not installed";
  }
  const std::filesystem::path index = BuildIndexDir("k8s", "IVF32,PQ8", 2);
  const std::string unsharded = BuildIndexDir("k8s_unsharded", "IVF32,PQ8", 1);
  ASSERT_OK_AND_ASSIGN(auto engine, CreateEngine(unsharded, 0, {.threads = 1}));
  const std::string run = testing::FreshTempDir("k8s_pods").string();
  const std::string manifests = run + "/knnserve.yaml";
  const std::string render = absl::StrCat(
      "/usr/bin/python3 deploy/kubernetes/render.py --shards 2 --replicas 2 --routers 1 ",
      "--namespace knn-test --index-claim data --index-path ", index.filename().string(),
      " --shard-threads 1 --shard-arg='--batch-threads 1' --router-arg='--probe-interval-ms 100' "
      "> ",
      manifests);
  ASSERT_EQ(std::system(render.c_str()), 0) << render;
  const std::string plan = run + "/plan.json";
  const std::string errors = run + "/errors.txt";
  const std::string check =
      absl::StrCat("/usr/bin/python3 tests/deploy/local_pods.py --manifests ", manifests,
                   " --claim data=", index.parent_path().string(), " --bin ", KNNSERVE_BIN_DIR,
                   " --run-dir ", run, " --out ", plan, " 2> ", errors);
  ASSERT_EQ(std::system(check.c_str()), 0) << ReadFile(errors);

  std::map<std::string, std::unique_ptr<Process>> pods;
  std::string router_address;
  for (const nlohmann::json& pod : nlohmann::json::parse(ReadFile(plan))) {
    const std::string name = pod["pod"];
    pods[name] = std::make_unique<Process>(pod["argv"].get<std::vector<std::string>>(),
                                           absl::StrCat(run, "/", name, ".log"));
    if (pod["component"] == "router") {
      router_address = absl::StrCat("127.0.0.1:", pod["ports"]["6000"].get<int>());
    }
  }
  ASSERT_EQ(pods.size(), 5u);
  ASSERT_FALSE(router_address.empty());
  EXPECT_EQ(pods["knnserve-shard-1-1"]->WaitForLog("serving", "shard"), "1");
  pods["knnserve-router-pod0"]->WaitForLog("serving", "msg");
  // The router serves once each shard has a replica; failover needs the other replicas known
  // up too (a replica is called only once its Info matched the shard's). Every replica has been
  // probed by then: those it logged down must come up.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::map<std::string, bool> down;
  do {
    absl::SleepFor(absl::Milliseconds(20));
    std::istringstream lines(ReadFile(run + "/knnserve-router-pod0.log"));
    for (std::string line; std::getline(lines, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      const std::string msg = j.value("msg", "");
      if (msg == "replica up" || msg == "replica down") {
        down[j.value("replica", "")] = msg == "replica down";
      }
    }
  } while (std::any_of(down.begin(), down.end(), [](const auto& r) { return r.second; }) &&
           absl::Now() < give_up);
  for (const auto& [replica, is_down] : down) {
    ASSERT_FALSE(is_down) << replica << " stays down:\n"
                          << ReadFile(run + "/knnserve-router-pod0.log");
  }
  auto stub = Connect(router_address);
  SearchQuery query;
  query.queries = Queries(8, 21);
  query.params.k = 7;
  query.params.nprobe = 4;
  v1::SearchRequest request = MakeRequest(query.queries, 7);
  request.mutable_params()->set_nprobe(4);
  for (const bool lost_a_pod : {false, true}) {
    if (lost_a_pod) {
      pods["knnserve-shard-1-0"]->Signal(SIGKILL);
      EXPECT_EQ(pods["knnserve-shard-1-0"]->Wait(absl::Seconds(10)), 128 + SIGKILL);
    }
    for (int call = 0; call < 4; ++call) {  // least-outstanding choice may pick either replica
      v1::SearchResponse response;
      const grpc::Status status = CallSearch(stub.get(), request, &response);
      ASSERT_TRUE(status.ok()) << status.error_message();
      ExpectEqualsEngine(response, *engine, query);
      EXPECT_EQ(response.coverage().shards_answered(), 2);
    }
  }
}

// The checks catch a shard map that lists a pod for another shard than the one it serves (the
// rendered map, edited by hand: shard 0's first replica is a pod of shard 1).
TEST(KubernetesManifests, ChecksRefuseAPodListedForAnotherShard) {
  if (std::system("/usr/bin/python3 -c 'import yaml' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-yaml is not installed";
  }
  const std::string run = testing::FreshTempDir("k8s_wrong_map").string();
  const std::string render = absl::StrCat(
      "/usr/bin/python3 deploy/kubernetes/render.py --shards 2 --replicas 2 --namespace ns | "
      "sed 's/^    0 knnserve-shard-0-0\\./    0 knnserve-shard-1-0./' > ",
      run, "/knnserve.yaml");
  ASSERT_EQ(std::system(render.c_str()), 0) << render;
  ASSERT_THAT(ReadFile(run + "/knnserve.yaml"), ::testing::HasSubstr("0 knnserve-shard-1-0."));
  const std::string check = absl::StrCat("/usr/bin/python3 tests/deploy/local_pods.py --manifests ",
                                         run, "/knnserve.yaml --claim knnserve-data=", run,
                                         " --run-dir ", run, " 2> ", run, "/errors.txt");
  EXPECT_NE(std::system(check.c_str()), 0);
  EXPECT_THAT(
      ReadFile(run + "/errors.txt"),
      ::testing::HasSubstr("knnserve-shard-1-0.knnserve-shard.ns.svc.cluster.local:7000 is a "
                           "pod of knnserve-shard-1, which serves shard 1, listed for "
                           "shard 0"));
}

// Kubernetes' gRPC probes speak plaintext: servers given --tls-cert are probed over TCP. The
// build Job renders alone (applied before the shards, not with them).
TEST(KubernetesManifests, TlsServersGetTcpProbesAndTheBuildJobRendersAlone) {
  if (std::system("/usr/bin/python3 -c 'import yaml' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-yaml is not installed";
  }
  const std::string out = testing::FreshTempDir("k8s_tls").string() + "/out.txt";
  EXPECT_EQ(std::system(absl::StrCat("/usr/bin/python3 tests/deploy/render_probes_and_job.py > ",
                                     out, " 2>&1")
                            .c_str()),
            0)
      << ReadFile(out);
}

// deploy/kubernetes/example.yaml is what render.py writes for its parameters (regenerate it
// with the command in its first line when render.py changes).
TEST(KubernetesManifests, ExampleIsWhatRenderWrites) {
  if (std::system("/usr/bin/python3 -c 'import yaml' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-yaml is not installed";
  }
  const std::string run = testing::FreshTempDir("k8s_example").string();
  const std::string example = ReadFile("deploy/kubernetes/example.yaml");
  const std::string first_line = example.substr(0, example.find('\n'));
  const std::string prefix = "# deploy/kubernetes/render.py ";
  ASSERT_EQ(first_line.rfind(prefix, 0), 0u) << first_line;
  const std::string render = absl::StrCat("(echo '", first_line, "'; /usr/bin/python3 ",
                                          first_line.substr(2), ") > ", run, "/example.yaml");
  ASSERT_EQ(std::system(render.c_str()), 0) << render;
  EXPECT_EQ(ReadFile(run + "/example.yaml"), example);
}

// The server image installs the packages deploy/docker/runtime-packages.sh lists: every library
// the shard and the router load has an owner, and an unknown file is refused by name.
TEST(ContainerImage, RuntimePackagesCoverEveryLibraryTheServersLoad) {
  const std::string out = testing::FreshTempDir("runtime_packages").string() + "/out.txt";
  const std::string list = absl::StrCat("deploy/docker/runtime-packages.sh ", Bin("knnserve-shard"),
                                        " ", Bin("knnserve-router"), " > ", out, " 2>&1");
  ASSERT_EQ(std::system(list.c_str()), 0) << ReadFile(out);
  EXPECT_THAT(ReadFile(out), ::testing::HasSubstr("libgrpc++"));
  const std::string missing = absl::StrCat(
      "deploy/docker/runtime-packages.sh /nonexistent/knnserve-shard > ", out, " 2>&1");
  EXPECT_NE(std::system(missing.c_str()), 0);
  EXPECT_THAT(ReadFile(out),
              ::testing::HasSubstr("/nonexistent/knnserve-shard is not an executable"));
}

}  // namespace
}  // namespace knnserve::testing
