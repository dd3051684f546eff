// Package badinput holds tests that feed every package's constructors and
// entry points the inputs they must refuse (identifiers PostgreSQL or
// DynamoDB cannot keep apart, nil contexts, nil databases and clients, an
// HTTP middleware that would protect nothing, nil options, explicit empty
// values that would be read as defaults) and check that each is refused
// with the package's invalid-argument error naming the parameter, before
// any I/O, with nothing written. It has no API.
package badinput
