// TLS and mTLS on both sides of the router, with a throw-away CA made by openssl in the test.
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/flat_engine.h"
#include "tests/server/test_cluster.h"
#include "tests/testing/temp_dir.h"

namespace knnserve::testing {
namespace {

constexpr int kDim = 8;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/knnserve_tls_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    const std::string script =
        absl::StrCat("set -e; cd ", dir_, "; exec >/dev/null 2>&1;", "openssl req -x509 ", key,
                     " -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca;",
                     "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.cnf;",
                     "for name in server client; do ", "openssl req ", key,
                     " -keyout $name.key -out $name.csr -subj /CN=localhost;",
                     "openssl x509 -req -in $name.csr -CA ca.pem -CAkey ca.key -CAcreateserial ",
                     "-out $name.pem -days 1 -extfile san.cnf; done");
    std::ofstream(absl::StrCat(dir_, "/make_certs.sh")) << script;
    ASSERT_EQ(std::system(absl::StrCat("bash ", dir_, "/make_certs.sh").c_str()), 0);
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  TlsFiles Files(const std::string& name, bool with_ca = true) const {
    return {absl::StrCat(dir_, "/", name, ".pem"), absl::StrCat(dir_, "/", name, ".key"),
            with_ca ? absl::StrCat(dir_, "/ca.pem") : ""};
  }

  std::string dir_;
};

TEST_F(TlsTest, RouterAndShardsSpeakMutualTls) {
  std::shared_ptr<const Datastore> data = MakeDatastore(40, kDim, 4, 3);
  TestShard shard(0, std::make_unique<FlatEngine>(data, 0, 40), {.tls = Files("server")});
  ShardMap map = {{0, {shard.address()}}};
  RouterOptions options = FastRouterOptions();
  options.shard_tls = Files("client");
  options.shard_tls_server_name = "localhost";
  TestRouter router(map, options, Files("server"));

  auto stub = Connect(router.address(), Files("client"));
  const Matrix<float> queries = RandomQueries(2, kDim, 1);
  v1::SearchResponse response;
  const grpc::Status status = CallSearch(stub.get(), MakeRequest(queries, 3), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  SearchQuery query;
  query.queries = queries;
  query.params.k = 3;
  ASSERT_OK_AND_ASSIGN(EngineResult expected, shard.engine()->Search(query));
  EXPECT_EQ(std::vector<int64_t>(response.ids().begin(), response.ids().end()),
            expected.neighbors.ids);

  // The shard requires a client certificate: a TLS client without one gets nowhere, and
  // neither does a plaintext client.
  TlsFiles no_cert;
  no_cert.ca = Files("client").ca;
  auto anonymous = Connect(shard.address(), no_cert);
  EXPECT_EQ(CallSearch(anonymous.get(), MakeRequest(queries, 3), &response, absl::Seconds(5))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  auto plaintext = Connect(shard.address());
  EXPECT_EQ(CallSearch(plaintext.get(), MakeRequest(queries, 3), &response, absl::Seconds(5))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST(TlsFlagsTest, CertificateWithoutKeyIsRejected) {
  EXPECT_FALSE(MakeServerCredentials({"cert.pem", "", ""}).ok());
  EXPECT_FALSE(MakeChannelCredentials({"", "key.pem", ""}).ok());
  EXPECT_FALSE(MakeServerCredentials({"/nonexistent.pem", "/nonexistent.key", ""}).ok());
}

TEST(TlsFlagsTest, AFileWithoutPemIsRefusedNamingIt) {
  const std::string dir = FreshTempDir("tls_flags").string();
  const std::string not_pem = dir + "/hostname";
  std::ofstream(not_pem) << "some-host\n";
  EXPECT_THAT(MakeServerCredentials({not_pem, not_pem, ""}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("'" + not_pem + "' holds no PEM block")));
}

}  // namespace
}  // namespace knnserve::testing
