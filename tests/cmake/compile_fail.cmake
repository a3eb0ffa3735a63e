# Run by ctest as: cmake -DSETTINGS=<file> -DSOURCE=<file.cpp> -P compile_fail.cmake
#
# Passes only if compiling SOURCE fails AND the first line of the compiler's
# output that contains "error" (the first error) contains the text of every
# expectation of SOURCE (substring, case-sensitive, trailing spaces ignored):
#
#   // expect: <text>         with every compiler
#   // expect-gcc: <text>     with g++ only
#   // expect-clang: <text>   with clang++ only
#
# The settings file names the compiler, its family (HEADROOM_CF_FAMILY: gcc or
# clang) and its flags. A file with no expectation for the family is an error.
#
# The settings may name a header that includes <headroom/headroom.hpp>
# (HEADROOM_CF_PCH), precompiled next to it by the build: a SOURCE whose first
# preprocessor directive is #include <headroom/headroom.hpp> is compiled with
# -include of that header, which is the same translation unit (the umbrella
# header is included once) without parsing it again. Where the precompiled
# file is missing or stale the check runs again without it.
#
#   cmake -DSETTINGS=<file> -DPRECOMPILE=<HEADROOM_CF_PCH>.gch|.pch -P compile_fail.cmake
# precompiles HEADROOM_CF_PCH with the same flags (the build does).
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED SETTINGS OR (NOT DEFINED SOURCE AND NOT DEFINED PRECOMPILE))
  message(FATAL_ERROR "compile_fail.cmake: -DSETTINGS=... and -DSOURCE=... (or -DPRECOMPILE=...) are required")
endif()
include(${SETTINGS})

# The compiler and its flags, as every check calls it.
set(base ${HEADROOM_CF_CXX} -std=c++20 ${HEADROOM_CF_FLAGS})
foreach(dir IN LISTS HEADROOM_CF_INCLUDES)
  if(NOT dir IN_LIST HEADROOM_CF_IMPLICIT_INCLUDES)
    list(APPEND base -I${dir})
  endif()
endforeach()
foreach(def IN LISTS HEADROOM_CF_DEFINITIONS)
  list(APPEND base -D${def})
endforeach()

if(DEFINED PRECOMPILE)
  set(ENV{LC_ALL} C)
  execute_process(COMMAND ${base} -x c++-header ${HEADROOM_CF_PCH} -o ${PRECOMPILE}.tmp
                          -MD -MT ${PRECOMPILE} -MF ${PRECOMPILE}.d
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "compile_fail.cmake: precompiling ${HEADROOM_CF_PCH} failed:\n${out}")
  endif()
  file(RENAME ${PRECOMPILE}.tmp ${PRECOMPILE})
  return()
endif()
get_filename_component(name ${SOURCE} NAME)

# Collect the expectations. The file is split into lines by hand so that ';',
# '[' and ']' in an expectation survive CMake's list handling.
if(NOT DEFINED HEADROOM_CF_FAMILY)
  set(HEADROOM_CF_FAMILY gcc)
endif()
file(READ ${SOURCE} text)
string(REPLACE ";" "@HEADROOM_SEMI@" text "${text}")
string(REPLACE "[" "@HEADROOM_LB@" text "${text}")
string(REPLACE "]" "@HEADROOM_RB@" text "${text}")
string(REPLACE "\n" ";" lines "${text}")
set(expects "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[ \t]*// expect(-gcc|-clang)?: (.*)$")
    set(family "${CMAKE_MATCH_1}")
    string(STRIP "${CMAKE_MATCH_2}" e)
    if(NOT e STREQUAL "" AND (family STREQUAL "" OR family STREQUAL "-${HEADROOM_CF_FAMILY}"))
      list(APPEND expects "${e}")
    endif()
  endif()
endforeach()
if(NOT expects)
  message(FATAL_ERROR "${name}: no '// expect: <text>' (or '// expect-${HEADROOM_CF_FAMILY}: <text>') line: "
    "say which error message the file must produce")
endif()

# Build the command line: with the precompiled umbrella header when the
# file's first directive includes it.
set(cmd ${base} -fsyntax-only ${SOURCE})
set(pch_cmd "")
if(HEADROOM_CF_PCH)
  if(HEADROOM_CF_FAMILY STREQUAL "gcc")
    set(pch_file ${HEADROOM_CF_PCH}.gch)
  else()
    set(pch_file ${HEADROOM_CF_PCH}.pch)
  endif()
  set(first_directive "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[ \t]*#")
      set(first_directive "${line}")
      break()
    endif()
  endforeach()
  if(first_directive MATCHES "^[ \t]*#[ \t]*include[ \t]*<headroom/headroom\\.hpp>[ \t]*$" AND EXISTS ${pch_file})
    set(pch_cmd ${base} -fsyntax-only -include ${HEADROOM_CF_PCH} ${SOURCE})
  endif()
endif()

set(ENV{LC_ALL} C)  # plain ASCII quotes in GCC's messages
set(out "")
if(pch_cmd)
  execute_process(COMMAND ${pch_cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(out MATCHES "precompiled|\\.pch|\\.gch")  # stale or unreadable: check without it
    set(pch_cmd "")
  else()
    set(cmd ${pch_cmd})
  endif()
endif()
if(NOT pch_cmd)
  execute_process(COMMAND ${cmd}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
endif()

list(JOIN cmd " " cmd_text)
function(show_output)
  string(REPLACE ";" "@HEADROOM_SEMI@" o "${out}")
  string(REPLACE "\n" ";" o "${o}")
  list(LENGTH o n)
  if(n GREATER 40)
    list(SUBLIST o 0 40 o)
    set(more "\n... (${n} lines in all)")
  endif()
  list(JOIN o "\n" o)
  string(REPLACE "@HEADROOM_SEMI@" ";" o "${o}")
  message("command: ${cmd_text}\n--- compiler output (first lines) ---\n${o}${more}")
endfunction()

if(rc EQUAL 0)
  show_output()
  message(FATAL_ERROR "${name}: compiled without error, but it must fail")
endif()

# The first error line.
string(REPLACE ";" "@HEADROOM_SEMI@" o "${out}")
string(REPLACE "[" "@HEADROOM_LB@" o "${o}")
string(REPLACE "]" "@HEADROOM_RB@" o "${o}")
string(REPLACE "\n" ";" o "${o}")
set(first "")
foreach(line IN LISTS o)
  string(FIND "${line}" "error" pos)
  if(NOT pos EQUAL -1)
    set(first "${line}")
    break()
  endif()
endforeach()
string(REPLACE "@HEADROOM_SEMI@" ";" first "${first}")
string(REPLACE "@HEADROOM_LB@" "[" first "${first}")
string(REPLACE "@HEADROOM_RB@" "]" first "${first}")

set(missing "")
set(found "")
foreach(e IN LISTS expects)
  string(REPLACE "@HEADROOM_SEMI@" ";" e "${e}")
  string(REPLACE "@HEADROOM_LB@" "[" e "${e}")
  string(REPLACE "@HEADROOM_RB@" "]" e "${e}")
  string(FIND "${first}" "${e}" pos)
  if(pos EQUAL -1)
    string(FIND "${out}" "${e}" later)
    if(later EQUAL -1)
      string(APPEND missing "\n  expected text not found: ${e}")
    else()
      string(APPEND missing "\n  expected text found, but not on the first error line: ${e}")
    endif()
  else()
    string(APPEND found "\n  found: ${e}")
  endif()
endforeach()
if(missing)
  show_output()
  message(FATAL_ERROR "${name}: failed to compile (exit ${rc}), but not with the expected message (${HEADROOM_CF_FAMILY}):${missing}\n"
    "  first error line: ${first}")
endif()
message("${name}: failed to compile (${HEADROOM_CF_FAMILY}), as expected${found}")
