// castmesh._castmesh metrics (castmesh/metrics.h; python/castmesh/metrics.py
// wraps them): snapshots as plain dicts, user instruments, and the
// read-only observer connection.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "castmesh/metrics.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "status_binding.h"

namespace castmesh::python {
namespace py = pybind11;

namespace {

py::dict flow_dict(const metrics::FlowMetrics& f) {
  return py::dict(py::arg("messages_in") = f.messages_in, py::arg("bytes_in") = f.bytes_in,
                  py::arg("messages_out") = f.messages_out, py::arg("bytes_out") = f.bytes_out);
}

py::dict to_dict(const metrics::ProcMetrics& p) {
  py::list actors;
  for (const metrics::ActorMetrics& a : p.actors) {
    actors.append(py::dict(py::arg("name") = a.name, py::arg("index") = a.index, py::arg("actor_class") = a.actor_class,
                           py::arg("messages_in") = a.messages_in, py::arg("messages_out") = a.messages_out,
                           py::arg("mailbox_depth") = a.mailbox_depth, py::arg("mailbox_max") = a.mailbox_max,
                           py::arg("handler_count") = a.handler_count, py::arg("handler_ns") = a.handler_ns,
                           py::arg("handler_buckets") = a.handler_buckets));
  }
  py::dict transports;
  for (const metrics::FlowMetrics& f : p.transports) transports[py::str(f.name)] = flow_dict(f);
  py::dict paths;
  for (const metrics::FlowMetrics& f : p.paths) paths[py::str(f.name)] = flow_dict(f);
  py::list communicators;
  for (const metrics::CommunicatorMetrics& c : p.communicators) {
    py::dict kinds;
    for (const metrics::CollectiveMetrics& k : c.collectives) {
      kinds[py::str(k.kind)] = py::dict(py::arg("calls") = k.calls, py::arg("bytes") = k.bytes);
    }
    communicators.append(py::dict(py::arg("description") = c.description, py::arg("rank") = c.rank,
                                  py::arg("size") = c.size, py::arg("collectives") = kinds));
  }
  py::list meters;
  for (const metrics::MeterInstrument& i : p.meters) {
    py::list series;
    for (const metrics::MeterSeries& s : i.series) {
      series.append(py::dict(py::arg("attributes") = s.attributes, py::arg("count") = s.count, py::arg("sum") = s.sum,
                             py::arg("min") = s.min, py::arg("max") = s.max, py::arg("buckets") = s.buckets));
    }
    meters.append(py::dict(py::arg("meter") = i.meter, py::arg("name") = i.name, py::arg("kind") = i.kind,
                           py::arg("description") = i.description, py::arg("unit") = i.unit,
                           py::arg("series") = series));
  }
  return py::dict(py::arg("rank") = p.proc.rank, py::arg("proc_id") = p.proc_id.empty() ? p.proc.id : p.proc_id,
                  py::arg("pid") = p.pid, py::arg("hostname") = p.proc.hostname, py::arg("label") = p.label,
                  py::arg("error") = p.status.ok() ? py::object(py::none()) : py::str(p.status.ToString()),
                  py::arg("actors") = actors, py::arg("transports") = transports, py::arg("paths") = paths,
                  py::arg("communicators") = communicators, py::arg("meters") = meters,
                  py::arg("handler_bucket_bounds_ns") = p.handler_bucket_bounds_ns,
                  py::arg("histogram_bounds") = p.histogram_bounds);
}

py::list to_list(const std::vector<metrics::ProcMetrics>& procs) {
  py::list out;
  for (const metrics::ProcMetrics& p : procs) out.append(to_dict(p));
  return out;
}

}  // namespace

void bind_metrics(py::module_& module) {
  module.def(
      "metrics_collect",
      [](const ProcMesh& procs, double timeout_s) {
        if (!(timeout_s > 0)) throw py::value_error("timeout must be a positive number of seconds");
        absl::StatusOr<std::vector<metrics::ProcMetrics>> got;
        {
          py::gil_scoped_release release;
          got = metrics::collect(procs, absl::Seconds(timeout_s));
        }
        if (!got.ok()) throw_status(got.status(), ErrorDomain::kProc);
        return to_list(*got);
      },
      py::arg("procs"), py::arg("timeout"), "Every proc's metrics snapshot (castmesh::metrics::collect), as dicts.");
  module.def(
      "metrics_this_process",
      [] {
        Runtime* runtime = Runtime::current();
        return to_dict(metrics::this_process(runtime));
      },
      "This process's metrics snapshot (its actors when it has a runtime).");
  py::class_<metrics::Counter>(module, "MeterCounter", "A user counter (castmesh::metrics::Counter).")
      .def(
          "add",
          [](const metrics::Counter& c, double value, const std::string& attributes) {
            if (absl::Status st = c.add(value, attributes); !st.ok()) throw py::value_error(std::string(st.message()));
          },
          py::arg("value"), py::arg("attributes") = "");
  py::class_<metrics::Histogram>(module, "MeterHistogram", "A user histogram (castmesh::metrics::Histogram).")
      .def(
          "record",
          [](const metrics::Histogram& h, double value, const std::string& attributes) {
            absl::Status st = h.record(value, attributes);
            if (!st.ok()) throw py::value_error(std::string(st.message()));
          },
          py::arg("value"), py::arg("attributes") = "");
  module.def(
      "meter_counter",
      [](const std::string& meter, const std::string& name, const std::string& description, const std::string& unit) {
        absl::StatusOr<metrics::Counter> c = metrics::counter(meter, name, description, unit);
        if (!c.ok()) throw py::value_error(std::string(c.status().message()));
        return *c;
      },
      py::arg("meter"), py::arg("name"), py::arg("description") = "", py::arg("unit") = "");
  module.def(
      "meter_histogram",
      [](const std::string& meter, const std::string& name, const std::string& description, const std::string& unit) {
        absl::StatusOr<metrics::Histogram> h = metrics::histogram(meter, name, description, unit);
        if (!h.ok()) throw py::value_error(std::string(h.status().message()));
        return *h;
      },
      py::arg("meter"), py::arg("name"), py::arg("description") = "", py::arg("unit") = "");
  module.def(
      "observer_target",
      [] {
        Runtime* runtime = Runtime::current();
        if (runtime == nullptr) {
          throw_status(absl::FailedPreconditionError("this process has no runtime: nothing to observe"),
                       ErrorDomain::kProc);
        }
        absl::StatusOr<metrics::ObserverTarget> target = metrics::observer_target(*runtime);
        if (!target.ok()) throw_status(target.status(), ErrorDomain::kProc);
        return py::make_tuple(target->address, target->secret);
      },
      "(address, secret) an observer of this controller connects with.");
  py::class_<metrics::Observer>(module, "Observer", "A read-only observer connection (castmesh::metrics::Observer).")
      .def_static(
          "connect",
          [](const std::string& address, const std::string& secret, const std::string& name, double timeout_s) {
            absl::StatusOr<std::unique_ptr<metrics::Observer>> observer;
            {
              py::gil_scoped_release release;
              observer = metrics::Observer::connect(address, secret, name, absl::Seconds(timeout_s));
            }
            if (!observer.ok()) throw_status(observer.status(), ErrorDomain::kProc);
            return std::move(*observer);
          },
          py::arg("address"), py::arg("secret"), py::arg("name"), py::arg("timeout"))
      .def(
          "metrics",
          [](metrics::Observer& o, double timeout_s) {
            absl::StatusOr<std::vector<metrics::ProcMetrics>> got;
            {
              py::gil_scoped_release release;
              got = o.metrics(absl::Seconds(timeout_s));
            }
            if (!got.ok()) throw_status(got.status(), ErrorDomain::kProc);
            return to_list(*got);
          },
          py::arg("timeout"))
      .def_property_readonly("target", &metrics::Observer::target)
      .def_property_readonly("label", &metrics::Observer::target_label);
}

}  // namespace castmesh::python
