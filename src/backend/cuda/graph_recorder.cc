#include "backend/cuda/graph_recorder.h"

#include <chrono>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {
namespace {

// cudaGraphExecUpdate's reason, and the kernel it names when the node is a kernel.
std::string describe_refusal(const cudaGraphExecUpdateResultInfo& info) {
  std::string why;
  switch (info.result) {
    case cudaGraphExecUpdateErrorTopologyChanged: why = "topology changed"; break;
    case cudaGraphExecUpdateErrorNodeTypeChanged: why = "node type changed"; break;
    case cudaGraphExecUpdateErrorFunctionChanged: why = "kernel function changed"; break;
    case cudaGraphExecUpdateErrorParametersChanged: why = "parameters changed"; break;
    case cudaGraphExecUpdateErrorNotSupported: why = "not supported"; break;
    case cudaGraphExecUpdateErrorUnsupportedFunctionChange: why = "unsupported function change"; break;
    case cudaGraphExecUpdateErrorAttributesChanged: why = "attributes changed"; break;
    default: why = "result " + std::to_string(int(info.result));
  }
  for (cudaGraphNode_t node : {info.errorNode, info.errorFromNode}) {
    if (!node) continue;
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) continue;
    why += ", node type " + std::to_string(int(type));
    cudaKernelNodeParams p{};
    const char* name = nullptr;
    if (type == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(node, &p) == cudaSuccess &&
        cudaFuncGetName(&name, p.func) == cudaSuccess && name)
      why += std::string(" (") + name + ")";
  }
  cudaGetLastError();
  return why;
}

}  // namespace

GraphRecorder::~GraphRecorder() {
  for (auto& [key, r] : recorded_)
    for (auto e : r.exec)
      if (e) cudaGraphExecDestroy(e);
}

void GraphRecorder::queue(const std::string& key, const std::function<void()>& step,
                          const std::function<void()>& before_launch) {
  const size_t first_slot = staging_.taken();
  const std::string op = "queue_recorded '" + key + "'";
  std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(capture(step, op.c_str()), cudaGraphDestroy);
  RecordedStep& r = recorded_[key];
  cudaGraphExec_t& exec = r.exec[r.next];
  r.next ^= 1;
  if (exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec, graph.get(), &info) == cudaSuccess) {
      ++counts_.updated;
    } else {
      cudaGetLastError();  // a refused update is not a sticky error: instantiate afresh
      if (counts_.first_refusal.empty()) counts_.first_refusal = key + ": " + describe_refusal(info);
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  }
  // A staging slot the capture filled is read when the graph runs: its event is recorded
  // again after the launch, or now if instantiating or launching fails.
  try {
    if (!exec) {
      check(cudaGraphInstantiate(&exec, graph.get(), 0), op.c_str(), "cudaGraphInstantiate");
      ++counts_.instantiated;
    }
    before_launch();
    check(cudaGraphLaunch(exec, stream_), op.c_str(), "cudaGraphLaunch");
  } catch (...) {
    staging_.restart_events(first_slot);
    throw;
  }
  ++counts_.launched;
  staging_.restart_events(first_slot);
}

GraphProbe GraphRecorder::probe(const std::function<void()>& step, int reps) {
  GraphProbe r;
  const Event begin("graph_probe"), end("graph_probe");
  // Owners: the checks below throw part-way.
  using GraphOwner = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, cudaError_t (*)(cudaGraph_t)>;
  using ExecOwner = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, cudaError_t (*)(cudaGraphExec_t)>;
  GraphOwner graph(nullptr, cudaGraphDestroy);
  ExecOwner exec(nullptr, cudaGraphExecDestroy);
  auto time_ms = [&](const std::function<void()>& one) {
    one();  // warm-up
    check(cudaEventRecord(begin, stream_), "graph_probe", "cudaEventRecord");
    for (int i = 0; i < reps; ++i) one();
    check(cudaEventRecord(end, stream_), "graph_probe", "cudaEventRecord");
    check(cudaEventSynchronize(end), "graph_probe", "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end), "graph_probe", "cudaEventElapsedTime");
    return double(ms) / reps;
  };
  r.launched_ms = time_ms(step);
  auto host_ms = [&](const std::function<void()>& what) {
    check(cudaStreamSynchronize(stream_), "graph_probe", "cudaStreamSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    what();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  r.host_enqueue_ms = host_ms(step);
  size_t first_slot = staging_.taken();
  r.host_capture_ms = host_ms([&] { graph.reset(capture(step, "graph_probe")); });
  staging_.restart_events(first_slot);
  check(cudaGraphGetNodes(graph.get(), nullptr, &r.nodes), "graph_probe", "cudaGraphGetNodes");
  check(cudaGraphGetEdges(graph.get(), nullptr, nullptr, nullptr, &r.edges), "graph_probe", "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(r.edges), to(r.edges);
  std::vector<cudaGraphEdgeData> data(r.edges);
  size_t n = r.edges;
  check(cudaGraphGetEdges(graph.get(), from.data(), to.data(), data.data(), &n), "graph_probe", "cudaGraphGetEdges");
  for (size_t i = 0; i < n; ++i) r.programmatic_edges += data[i].type == cudaGraphDependencyTypeProgrammatic;
  r.host_instantiate_ms = host_ms([&] {
    cudaGraphExec_t e = nullptr;
    check(cudaGraphInstantiate(&e, graph.get(), 0), "graph_probe", "cudaGraphInstantiate");
    exec.reset(e);
  });
  {
    first_slot = staging_.taken();
    const GraphOwner again(capture(step, "graph_probe"), cudaGraphDestroy);
    staging_.restart_events(first_slot);
    cudaGraphExecUpdateResultInfo info{};
    cudaError_t e = cudaSuccess;
    r.host_update_ms = host_ms([&] { e = cudaGraphExecUpdate(exec.get(), again.get(), &info); });
    check(e, "graph_probe", "cudaGraphExecUpdate");
  }
  r.replayed_ms = time_ms([&] { check(cudaGraphLaunch(exec.get(), stream_), "graph_probe", "cudaGraphLaunch"); });
  return r;
}

cudaGraph_t GraphRecorder::capture(const std::function<void()>& step, const char* op) {
  const size_t first_slot = staging_.taken();
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), op, "cudaStreamBeginCapture");
  try {
    step();
  } catch (...) {
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    staging_.restart_events(first_slot);
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph), op, "cudaStreamEndCapture");
  return graph;
}

}  // namespace dflash::cuda
