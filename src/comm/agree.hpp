// Collective error agreement: every rank runs a phase, then all learn whether any rank failed.
// The lowest failing rank prints its one line; every rank then throws AgreedError and the job exits
// non-zero everywhere, with no rank left waiting in a collective the others will never join.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>

namespace relay {

void agree_on_errors(MPI_Comm comm, const std::function<void()>& phase);
// Prints "[rank r] error: <msg>" on stderr (with hint lines as given).
void print_error(const std::string& msg);

}  // namespace relay
