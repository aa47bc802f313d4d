package ipfix

import "time"

// Rate limits of the listeners' warnings about what exporters send
// (ratelog.Limiter).
const (
	// warnEvery is the interval of warnings per kind and source: one line,
	// then the number held back with the next one. Counters see everything.
	warnEvery = time.Minute
	// warnSources bounds the sources remembered per limiter (about 100 B
	// each); past it, new sources share one line per kind.
	warnSources = 1024
)
