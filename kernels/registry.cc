#include "kernels/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera::kernels {
namespace {

std::string DTypeList(const std::vector<DType>& dtypes) {
  return absl::StrJoin(dtypes, ", ",
                       [](std::string* out, DType d) { absl::StrAppend(out, DTypeName(d)); });
}

// Converts where the meaning is unambiguous (an int for a float attribute, a list of ints
// for a list of floats); anything else is a type error.
std::optional<AttrValue> Coerce(const AttrValue& value, AttrType type) {
  if (value.index() == static_cast<size_t>(type)) return value;
  if (type == AttrType::kFloat && std::holds_alternative<int64_t>(value)) {
    return static_cast<double>(std::get<int64_t>(value));
  }
  if (type == AttrType::kFloats && std::holds_alternative<std::vector<int64_t>>(value)) {
    const auto& ints = std::get<std::vector<int64_t>>(value);
    return std::vector<double>(ints.begin(), ints.end());
  }
  return std::nullopt;
}

}  // namespace

absl::string_view AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kInt:
      return "int";
    case AttrType::kFloat:
      return "float";
    case AttrType::kBool:
      return "bool";
    case AttrType::kString:
      return "string";
    case AttrType::kInts:
      return "ints";
    case AttrType::kFloats:
      return "floats";
  }
  return "?";
}

Registry::Registry(std::vector<KernelDef> kernels) : kernels_(std::move(kernels)) {
  std::sort(kernels_.begin(), kernels_.end(),
            [](const KernelDef& a, const KernelDef& b) { return a.name < b.name; });
}

const Registry& Registry::Global() {
  static const Registry* registry = new Registry(BuiltinKernels());
  return *registry;
}

const KernelDef* Registry::Find(absl::string_view name) const {
  auto it = std::lower_bound(kernels_.begin(), kernels_.end(), name,
                             [](const KernelDef& k, absl::string_view n) { return k.name < n; });
  return it != kernels_.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<Plan> Registry::Prepare(absl::string_view name, std::vector<TensorMeta> inputs,
                                       Attrs attrs, const OutputHints& hints) const {
  const KernelDef* k = Find(name);
  if (k == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("kernel \"", name.substr(0, 64),
                                                   "\" is unknown; ListKernels lists the ",
                                                   kernels_.size(), " kernels"));
  }
  return PrepareKernel(*k, std::move(inputs), std::move(attrs), hints);
}

absl::StatusOr<Plan> PrepareKernel(const KernelDef& kernel, std::vector<TensorMeta> inputs,
                                   Attrs attrs, const OutputHints& hints) {
  const KernelDef* k = &kernel;
  size_t required = std::count_if(k->inputs.begin(), k->inputs.end(),
                                  [](const ParamDef& p) { return !p.optional; });
  if (inputs.size() < required || inputs.size() > k->inputs.size()) {
    std::vector<std::string> names;
    for (const ParamDef& p : k->inputs) names.push_back(p.optional ? p.name + "?" : p.name);
    return absl::InvalidArgumentError(absl::StrCat(
        k->name, " takes ", required == k->inputs.size() ? "" : absl::StrCat(required, " to "),
        k->inputs.size(), " inputs (", absl::StrJoin(names, ", "), "); got ", inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ParamDef& p = k->inputs[i];
    if (std::find(p.dtypes.begin(), p.dtypes.end(), inputs[i].dtype) == p.dtypes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(k->name, " input ", i, " (", p.name,
                                                     ") has dtype ", DTypeName(inputs[i].dtype),
                                                     "; accepted: ", DTypeList(p.dtypes)));
    }
    absl::Status valid = NumElements(inputs[i].shape, absl::StrCat("input ", i, " shape")).status();
    if (!valid.ok()) return valid;
  }
  for (const auto& [attr_name, value] : attrs) {
    auto def = std::find_if(k->attrs.begin(), k->attrs.end(),
                            [&](const AttrDef& a) { return a.name == attr_name; });
    if (def == k->attrs.end()) {
      std::vector<std::string> names;
      for (const AttrDef& a : k->attrs) names.push_back(a.name);
      return absl::InvalidArgumentError(absl::StrCat(
          k->name, " has no attribute \"", attr_name.substr(0, 64),
          "\"; its attributes: ", names.empty() ? "none" : absl::StrJoin(names, ", ")));
    }
    std::optional<AttrValue> coerced = Coerce(value, def->type);
    if (!coerced) {
      return absl::InvalidArgumentError(
          absl::StrCat(k->name, " attribute ", attr_name, " must be ", AttrTypeName(def->type),
                       "; got ", AttrTypeName(static_cast<AttrType>(value.index()))));
    }
    attrs[attr_name] = *std::move(coerced);
  }
  for (const AttrDef& def : k->attrs) {
    if (attrs.contains(def.name)) continue;
    if (def.required) {
      return absl::InvalidArgumentError(absl::StrCat(k->name, " attribute ", def.name, " (",
                                                     AttrTypeName(def.type), ") is required"));
    }
    if (def.default_value) attrs[def.name] = *def.default_value;
  }
  if (hints.size() > k->outputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(k->name, " has ", k->outputs.size(), " output(s); got ", hints.size()));
  }
  absl::StatusOr<std::vector<TensorMeta>> outputs = k->infer(inputs, attrs, hints);
  if (!outputs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(k->name, ": ", outputs.status().message()));
  }
  for (size_t i = 0; i < outputs->size(); ++i) {
    absl::Status valid =
        ByteSize((*outputs)[i], absl::StrCat(k->name, " output ", i, " shape")).status();
    if (!valid.ok()) return valid;
    if (i < hints.size() && hints[i] && !(*hints[i] == (*outputs)[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          k->name, " output ", i, " (", k->outputs[i].name, ") is ", MetaString((*outputs)[i]),
          " but the given output tensor is ", MetaString(*hints[i])));
    }
  }
  return Plan{k, std::move(inputs), *std::move(outputs), std::move(attrs), nullptr};
}

int64_t AttrInt(const Attrs& attrs, absl::string_view name) {
  return std::get<int64_t>(attrs.find(name)->second);
}
double AttrFloat(const Attrs& attrs, absl::string_view name) {
  return std::get<double>(attrs.find(name)->second);
}
bool AttrBool(const Attrs& attrs, absl::string_view name) {
  return std::get<bool>(attrs.find(name)->second);
}
const std::string& AttrString(const Attrs& attrs, absl::string_view name) {
  return std::get<std::string>(attrs.find(name)->second);
}
const std::vector<int64_t>& AttrInts(const Attrs& attrs, absl::string_view name) {
  return std::get<std::vector<int64_t>>(attrs.find(name)->second);
}
bool HasAttr(const Attrs& attrs, absl::string_view name) { return attrs.contains(name); }

}  // namespace tessera::kernels
