// engram-model-step's self-check: its GEMM and Engram mixer kernels against the host on small
// inputs, before anything is measured with them.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench/model/model_kernels.h"
#include "bench/model/model_step.h"

namespace engram::bench::model_step {

void CheckGemm(cudaStream_t stream) {
  // A row count that is not a tile multiple.
  const uint32_t m = 100, n = 256, k = 96;
  std::vector<uint16_t> a(m * k), b(k * n), c(m * n);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = FloatToBf16(u(rng));
  for (auto& x : b) x = FloatToBf16(u(rng));
  Dev ad(a.size() * 2), bd(b.size() * 2), cd(c.size() * 2);
  Upload(ad, a), Upload(bd, b);
  CUDA_CHECK(Gemm(ad.get<uint16_t>(), bd.get<uint16_t>(), cd.get<uint16_t>(), m, n, k, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaMemcpy(c.data(), cd.p, c.size() * 2, cudaMemcpyDeviceToHost));
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t j = 0; j < n; ++j) {
      double want = 0;
      for (uint32_t q = 0; q < k; ++q)
        want += Bf16ToFloat(a[i * k + q]) * Bf16ToFloat(b[q * n + j]);
      const double got = Bf16ToFloat(c[i * n + j]);
      if (std::fabs(got - want) > 0.02 * std::fabs(want) + 0.05) {
        throw Failure("self-check: GEMM C[" + std::to_string(i) + "][" + std::to_string(j) +
                      "] = " + std::to_string(got) + ", want " + std::to_string(want));
      }
    }
  }
}

namespace {

// The mixer's inputs for the self-check, on the host.
struct MixerCase {
  static constexpr uint32_t t = 24, h = 256, hc = 4, seq = 12;  // 2 sequences of 12 tokens
  std::vector<uint16_t> proj, hid;
  std::vector<float> kn, qn, cn, cw;
  MixerCase() : proj(t * (1 + hc) * h), hid(t * hc * h) {
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : proj) x = FloatToBf16(u(rng));
    for (auto& x : hid) x = FloatToBf16(u(rng));
    kn = RandomFloats(hc * h, 5, 0.5, 1.5), qn = RandomFloats(hc * h, 6, 0.5, 1.5);
    cn = RandomFloats(h, 7, 0.5, 1.5), cw = RandomFloats(h * 4, 8, -0.5, 0.5);
  }
  double F(uint16_t v) const { return Bf16ToFloat(v); }
  // gated and normed of one (token, branch), as EngramMixer computes them.
  void Gate(uint32_t i, uint32_t br, std::vector<double>& gated,
            std::vector<double>& normed) const {
    const uint16_t* key = &proj[(i * (1 + hc) + 1 + br) * h];
    const uint16_t* query = &hid[(i * hc + br) * h];
    double sk = 0, sq = 0, sv = 0, score = 0;
    for (uint32_t j = 0; j < h; ++j) sk += F(key[j]) * F(key[j]), sq += F(query[j]) * F(query[j]);
    const double rk = 1 / std::sqrt(sk / h + 1e-6), rq = 1 / std::sqrt(sq / h + 1e-6);
    for (uint32_t j = 0; j < h; ++j) {
      score += F(key[j]) * rk * kn[br * h + j] * F(query[j]) * rq * qn[br * h + j];
    }
    score /= std::sqrt(double(h));
    const double root = std::sqrt(std::max(std::fabs(score), 1e-6));
    const double gate = 1 / (1 + std::exp(score < 0 ? root : -root));
    const size_t at = (i * hc + br) * h;
    for (uint32_t j = 0; j < h; ++j) {
      gated[at + j] = gate * F(proj[i * (1 + hc) * h + j]);
      sv += gated[at + j] * gated[at + j];
    }
    for (uint32_t j = 0; j < h; ++j)
      normed[at + j] = gated[at + j] / std::sqrt(sv / h + 1e-6) * cn[j];
  }
  // The layer's output: hidden + gated + SiLU(causal depthwise convolution of normed).
  std::vector<double> Want() const {
    std::vector<double> gated(t * hc * h), normed(t * hc * h), want(t * hc * h);
    for (uint32_t i = 0; i < t; ++i) {
      for (uint32_t br = 0; br < hc; ++br) Gate(i, br, gated, normed);
    }
    for (uint32_t i = 0; i < t; ++i) {
      for (uint32_t br = 0; br < hc; ++br) {
        for (uint32_t j = 0; j < h; ++j) {
          double acc = 0;
          for (uint32_t tap = 0; tap < 4; ++tap) {
            const uint32_t back = (3 - tap) * 3;
            if (i % seq >= back) acc += cw[j * 4 + tap] * normed[((i - back) * hc + br) * h + j];
          }
          const size_t at = (i * hc + br) * h + j;
          want[at] = F(hid[at]) + gated[at] + acc / (1 + std::exp(-acc));
        }
      }
    }
    return want;
  }
};

}  // namespace

void CheckMixer(cudaStream_t stream) {
  const MixerCase c;
  Dev pd(c.proj.size() * 2), hd(c.hid.size() * 2), knd(c.kn.size() * 4), qnd(c.qn.size() * 4),
      cnd(c.cn.size() * 4), cwd(c.cw.size() * 4), gd(c.hid.size() * 2), nd(c.hid.size() * 2);
  Upload(pd, c.proj), Upload(hd, c.hid), Upload(knd, c.kn), Upload(qnd, c.qn), Upload(cnd, c.cn),
      Upload(cwd, c.cw);
  MixerArgs ma{c.t,
               c.h,
               c.hc,
               c.seq,
               pd.get<uint16_t>(),
               hd.get<uint16_t>(),
               knd.get<float>(),
               qnd.get<float>(),
               cnd.get<float>(),
               cwd.get<float>(),
               gd.get<uint16_t>(),
               nd.get<uint16_t>()};
  CUDA_CHECK(EngramMix(ma, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> got(c.hid.size());
  CUDA_CHECK(cudaMemcpy(got.data(), hd.p, got.size() * 2, cudaMemcpyDeviceToHost));
  const std::vector<double> want = c.Want();
  for (size_t at = 0; at < want.size(); ++at) {
    if (std::fabs(c.F(got[at]) - want[at]) > 0.03 * std::fabs(want[at]) + 0.03) {
      throw Failure("self-check: Engram mixer output " + std::to_string(at) + " (token " +
                    std::to_string(at / (c.hc * c.h)) + ") = " + std::to_string(c.F(got[at])) +
                    ", want " + std::to_string(want[at]));
    }
  }
}

}  // namespace engram::bench::model_step
