# The source lists, explicit so that a new file is a reviewed change (no globs), shared by
# the main build (CMakeLists.txt) and the fuzz build (fuzz/CMakeLists.txt). Paths are
# relative to the project root; CKPT_ROOT is set by the includer.

# libckpt_core.so: parsers, the checkpoint model, writers and reports. No LibTorch.
set(CKPT_CORE_SOURCES
  ${CKPT_ROOT}/src/base/dtype.cpp
  ${CKPT_ROOT}/src/base/error.cpp
  ${CKPT_ROOT}/src/base/text.cpp
  ${CKPT_ROOT}/src/base/text_escape.cpp
  ${CKPT_ROOT}/src/io/byte_source.cpp
  ${CKPT_ROOT}/src/io/file_opener.cpp
  ${CKPT_ROOT}/src/io/input_file.cpp
  ${CKPT_ROOT}/src/io/memory_opener.cpp
  ${CKPT_ROOT}/src/io/output_set.cpp
  ${CKPT_ROOT}/src/io/slice_source.cpp
  ${CKPT_ROOT}/src/io/staging_pipeline.cpp
  ${CKPT_ROOT}/src/io/sys_io.cpp
  ${CKPT_ROOT}/src/io/temp_registry.cpp
  ${CKPT_ROOT}/src/zip/zip_names.cpp
  ${CKPT_ROOT}/src/zip/zip_reader.cpp
  ${CKPT_ROOT}/src/zip/zip_writer.cpp
  ${CKPT_ROOT}/src/pickle/pickle_keys.cpp
  ${CKPT_ROOT}/src/pickle/pickle_machine.cpp
  ${CKPT_ROOT}/src/pickle/pickle_names.cpp
  ${CKPT_ROOT}/src/pickle/pickle_opcodes.cpp
  ${CKPT_ROOT}/src/pickle/pickle_repr.cpp
  ${CKPT_ROOT}/src/pickle/pickle_text.cpp
  ${CKPT_ROOT}/src/pickle/pickle_value.cpp
  ${CKPT_ROOT}/src/pickle/pickle_writer.cpp
  ${CKPT_ROOT}/src/pickle/weights_only_globals.cpp
  ${CKPT_ROOT}/src/formats/dcp_coverage.cpp
  ${CKPT_ROOT}/src/formats/dcp_metadata.cpp
  ${CKPT_ROOT}/src/formats/dcp_vocabulary.cpp
  ${CKPT_ROOT}/src/formats/format_detect.cpp
  ${CKPT_ROOT}/src/formats/hf_index.cpp
  ${CKPT_ROOT}/src/formats/hf_shard_plan.cpp
  ${CKPT_ROOT}/src/formats/legacy_reader.cpp
  ${CKPT_ROOT}/src/formats/pickled_module.cpp
  ${CKPT_ROOT}/src/formats/safetensors.cpp
  ${CKPT_ROOT}/src/formats/safetensors_writer.cpp
  ${CKPT_ROOT}/src/formats/tensor_collector.cpp
  ${CKPT_ROOT}/src/formats/tensor_kinds.cpp
  ${CKPT_ROOT}/src/formats/torchscript_code.cpp
  ${CKPT_ROOT}/src/model/checkpoint.cpp
  ${CKPT_ROOT}/src/model/layout.cpp
  ${CKPT_ROOT}/src/model/key_table.cpp
  ${CKPT_ROOT}/src/model/read_plan.cpp
  ${CKPT_ROOT}/src/rekey/rekey_file.cpp
  ${CKPT_ROOT}/src/rekey/rekey_plan.cpp
  ${CKPT_ROOT}/src/rekey/rename_spec.cpp
  ${CKPT_ROOT}/src/rekey/wrappers.cpp
  ${CKPT_ROOT}/src/report/json_input.cpp
  ${CKPT_ROOT}/src/report/json_text.cpp
  ${CKPT_ROOT}/src/report/json_writer.cpp
  ${CKPT_ROOT}/src/report/report.cpp
  ${CKPT_ROOT}/src/report/verify.cpp
  ${CKPT_ROOT}/src/plugin/module_loader.cpp
  ${CKPT_ROOT}/src/plugin/torch_plugin.cpp
)

# libckpt_torch.so: everything that creates tensors or TorchScript modules through LibTorch.
set(CKPT_TORCH_SOURCES
  ${CKPT_ROOT}/src/torch/aten_types.cpp
  ${CKPT_ROOT}/src/torch/finite_check.cpp
  ${CKPT_ROOT}/src/torch/load.cpp
  ${CKPT_ROOT}/src/torch/loader/cpu_loader.cpp
  ${CKPT_ROOT}/src/torch/loader/cuda_module.cpp
  ${CKPT_ROOT}/src/torch/loader/host_buffer.cpp
  ${CKPT_ROOT}/src/torch/loader/page_filler.cpp
  ${CKPT_ROOT}/src/torch/loader/storage_loader.cpp
  ${CKPT_ROOT}/src/torch/materialize.cpp
  ${CKPT_ROOT}/src/torch/meta_kernels.cpp
  ${CKPT_ROOT}/src/torch/method_args.cpp
  ${CKPT_ROOT}/src/torch/model_file_tensors.cpp
  ${CKPT_ROOT}/src/torch/save_tensors.cpp
  ${CKPT_ROOT}/src/torch/torch_message.cpp
  ${CKPT_ROOT}/src/torch/torchscript.cpp
)

# The pinned-ring CUDA executor, built where LibTorch has CUDA.
set(CKPT_CUDA_SOURCES
  ${CKPT_ROOT}/src/torch/cuda/cuda_copy_engine.cpp
  ${CKPT_ROOT}/src/torch/cuda/cuda_loader.cpp
)

# The entry points of the two dlopen modules (libckptool_torch.so, libckptool_torch_cuda.so).
set(CKPT_TORCH_MODULE_ENTRY ${CKPT_ROOT}/src/plugin/torch_plugin_entry.cpp)
set(CKPT_CUDA_MODULE_ENTRY ${CKPT_ROOT}/src/plugin/cuda_plugin_entry.cpp)

# The command-line executable: one file per verb plus its shared helpers.
set(CKPTOOL_CLI_SOURCES
  ${CKPT_ROOT}/cli/cmd_inspect.cpp
  ${CKPT_ROOT}/cli/cmd_materialize.cpp
  ${CKPT_ROOT}/cli/cmd_rekey.cpp
  ${CKPT_ROOT}/cli/cmd_verify.cpp
  ${CKPT_ROOT}/cli/common.cpp
  ${CKPT_ROOT}/cli/input_spec.cpp
  ${CKPT_ROOT}/cli/inspect_text.cpp
  ${CKPT_ROOT}/cli/load_guard.cpp
  ${CKPT_ROOT}/cli/main.cpp
  ${CKPT_ROOT}/cli/progress.cpp
  ${CKPT_ROOT}/cli/sigbus.cpp
  ${CKPT_ROOT}/cli/signals.cpp
  ${CKPT_ROOT}/cli/validators.cpp
)

# Every header the executable and the LibTorch modules share: their hash is the build id
# (cmake/build_id.cmake) checked when a module is opened.
set(CKPT_SHARED_HEADERS
  ${CKPT_ROOT}/include/ckpt/byte_source.h
  ${CKPT_ROOT}/include/ckpt/checkpoint.h
  ${CKPT_ROOT}/include/ckpt/dcp.h
  ${CKPT_ROOT}/include/ckpt/dim_list.h
  ${CKPT_ROOT}/include/ckpt/dtype.h
  ${CKPT_ROOT}/include/ckpt/error.h
  ${CKPT_ROOT}/include/ckpt/file_opener.h
  ${CKPT_ROOT}/include/ckpt/input_file.h
  ${CKPT_ROOT}/include/ckpt/key_table.h
  ${CKPT_ROOT}/include/ckpt/load.h
  ${CKPT_ROOT}/include/ckpt/materialize.h
  ${CKPT_ROOT}/include/ckpt/output_set.h
  ${CKPT_ROOT}/include/ckpt/pickle.h
  ${CKPT_ROOT}/include/ckpt/pickle_items.h
  ${CKPT_ROOT}/include/ckpt/pickle_node_text.h
  ${CKPT_ROOT}/include/ckpt/pickle_writer.h
  ${CKPT_ROOT}/include/ckpt/rekey.h
  ${CKPT_ROOT}/include/ckpt/rekey_file.h
  ${CKPT_ROOT}/include/ckpt/report.h
  ${CKPT_ROOT}/include/ckpt/safetensors.h
  ${CKPT_ROOT}/include/ckpt/sys_io.h
  ${CKPT_ROOT}/include/ckpt/torchscript.h
  ${CKPT_ROOT}/include/ckpt/torchscript_code.h
  ${CKPT_ROOT}/include/ckpt/verify.h
  ${CKPT_ROOT}/include/ckpt/wrappers.h
  ${CKPT_ROOT}/include/ckpt/zip_reader.h
  ${CKPT_ROOT}/include/ckpt/zip_writer.h
  ${CKPT_ROOT}/src/base/byteio.h
  ${CKPT_ROOT}/src/base/pointer_map.h
  ${CKPT_ROOT}/src/base/string_index.h
  ${CKPT_ROOT}/src/base/text.h
  ${CKPT_ROOT}/src/base/text_escape.h
  ${CKPT_ROOT}/src/formats/format_detect.h
  ${CKPT_ROOT}/src/formats/legacy_reader.h
  ${CKPT_ROOT}/src/formats/pickled_module.h
  ${CKPT_ROOT}/src/formats/tensor_collector.h
  ${CKPT_ROOT}/src/io/copy_engine.h
  ${CKPT_ROOT}/src/io/slice_source.h
  ${CKPT_ROOT}/src/io/staging_pipeline.h
  ${CKPT_ROOT}/src/io/temp_registry.h
  ${CKPT_ROOT}/src/model/layout.h
  ${CKPT_ROOT}/src/model/read_plan.h
  ${CKPT_ROOT}/src/pickle/node_marks.h
  ${CKPT_ROOT}/src/pickle/pickle_accessors.h
  ${CKPT_ROOT}/src/pickle/pickle_keys.h
  ${CKPT_ROOT}/src/pickle/pickle_names.h
  ${CKPT_ROOT}/src/pickle/pickle_opcodes.h
  ${CKPT_ROOT}/src/pickle/pickle_text.h
  ${CKPT_ROOT}/src/plugin/module_loader.h
  ${CKPT_ROOT}/src/plugin/torch_plugin.h
  ${CKPT_ROOT}/src/rekey/rename_spec.h
  ${CKPT_ROOT}/src/report/json_input.h
  ${CKPT_ROOT}/src/report/json_writer.h
  ${CKPT_ROOT}/src/torch/aten_types.h
  ${CKPT_ROOT}/src/torch/cuda/cuda_copy_engine.h
  ${CKPT_ROOT}/src/torch/finite_check.h
  ${CKPT_ROOT}/src/torch/loader/host_buffer.h
  ${CKPT_ROOT}/src/torch/loader/page_filler.h
  ${CKPT_ROOT}/src/torch/loader/storage_loader.h
  ${CKPT_ROOT}/src/torch/meta_kernels.h
  ${CKPT_ROOT}/src/torch/method_args.h
  ${CKPT_ROOT}/src/torch/model_file_tensors.h
  ${CKPT_ROOT}/src/torch/torch_message.h
  ${CKPT_ROOT}/src/torch/torchscript_module.h
  ${CKPT_ROOT}/src/zip/zip_format.h
  ${CKPT_ROOT}/src/zip/zip_names.h
)
