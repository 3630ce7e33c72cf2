module zipline/transform

go 1.27.1

require go.bytecodealliance.org/pkg v0.4.0

replace go.bytecodealliance.org/pkg => ./third_party_pkg
