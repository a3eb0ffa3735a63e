# Run by ctest (tests/docs/CMakeLists.txt): build one unit of documentation
# code, a C++ block of README.md or docs/*.md with the blocks marked
# "continued" after it, and run it when it is a whole program.
#   -DBUILD_DIR -DTARGET -DSOURCE=<page>:<line> -DBLOCKS=<n> [-DCONFIG]
#   [-DRUN=<program, or a launcher's command: its words joined by |> -DWORK_DIR=<dir>]
#   [-DSKIP=<why it is not built>]
cmake_minimum_required(VERSION 3.25)
if(SKIP)
  message("doc block skipped: ${SOURCE}: ${SKIP}")
  return()
endif()

function(show label text)
  string(REPLACE ";" "@HR_SEMI@" t "${text}")
  string(REPLACE "\n" ";" t "${t}")
  list(LENGTH t n)
  set(more "")
  if(n GREATER 80)
    list(SUBLIST t 0 80 t)
    set(more "\n... (${n} lines in all)")
  endif()
  list(JOIN t "\n" t)
  string(REPLACE "@HR_SEMI@" ";" t "${t}")
  message("--- ${label} ---\n${t}${more}")
endfunction()

set(build ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET})
if(CONFIG)
  list(APPEND build --config ${CONFIG})
endif()
execute_process(COMMAND ${build} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  show("build output (messages name the page and line)" "${out}")
  message(FATAL_ERROR "${SOURCE}: the code block (${BLOCKS} block(s) from here on) does not compile as written")
endif()
set(what "compiled")
if(RUN)
  file(REMOVE_RECURSE ${WORK_DIR})
  file(MAKE_DIRECTORY ${WORK_DIR})
  string(REPLACE "|" ";" run "${RUN}")
  execute_process(COMMAND ${run} WORKING_DIRECTORY ${WORK_DIR}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  show("program output" "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SOURCE}: the program compiled but exited with ${rc}")
  endif()
  set(what "compiled, linked and ran")
endif()
message("${SOURCE}: ${BLOCKS} block(s) ${what}")
