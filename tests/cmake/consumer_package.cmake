# Run by ctest: install the build tree into a fresh prefix, then configure,
# build and run tests/consumer against it with find_package(headroom).
#   -DBUILD_DIR -DCONFIG -DSOURCE_DIR -DWORK_DIR -DGENERATOR -DCXX [-DEIGEN3_DIR -DBOOST_DIR]
cmake_minimum_required(VERSION 3.25)
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " cmd)
    message(FATAL_ERROR "consumer_package: ${step} failed (exit ${rc})\ncommand: ${cmd}\n${out}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

set(config_args "")
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()
run(install ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} ${config_args})

set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} -G ${GENERATOR}
  -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CONFIG)
  list(APPEND configure -DCMAKE_BUILD_TYPE=${CONFIG})
endif()
if(EIGEN3_DIR)
  list(APPEND configure -DEigen3_DIR=${EIGEN3_DIR})
endif()
if(BOOST_DIR)
  list(APPEND configure -DBoost_DIR=${BOOST_DIR})
endif()
run(configure ${configure})

# The package must come from the fresh prefix, not from an older install.
file(STRINGS ${build}/CMakeCache.txt found_dir REGEX "^headroom_DIR:")
string(REGEX REPLACE "^headroom_DIR:[A-Z]*=" "" found_dir "${found_dir}")
file(REAL_PATH "${prefix}" real_prefix)
file(REAL_PATH "${found_dir}" real_found)
string(FIND "${real_found}" "${real_prefix}/" pos)
if(NOT pos EQUAL 0)
  message(FATAL_ERROR "consumer_package: headroom was found at '${found_dir}', not under ${prefix}")
endif()

run(build ${CMAKE_COMMAND} --build ${build} ${config_args})

set(app ${build}/app)
if(NOT EXISTS ${app} AND CONFIG)
  set(app ${build}/${CONFIG}/app)
endif()
run(app ${app})
message("consumer_package: headroom found at ${found_dir}; app printed:\n${out}")
