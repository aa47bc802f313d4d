package ipfix

import "github.com/dualflow/dualflow/flow"

// Internals for the round-trip tests of package ipfix_test, which decode
// with the collector (collector/ipfix imports this package, so only an
// external test package can import it).

// MaxString is the longest string an element carries.
const MaxString = maxString

// Row is a row of the round-trip tables.
type Row struct {
	Name string
	Rec  flow.Record
}

// RoundTripRecords returns testRecords.
func RoundTripRecords() []Row {
	var rows []Row
	for _, tc := range testRecords() {
		rows = append(rows, Row{tc.name, tc.rec})
	}
	return rows
}
