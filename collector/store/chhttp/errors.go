package chhttp

import "net/http"

// ClickHouse error codes used by the HTTP layer (src/Common/ErrorCodes.cpp;
// checked against errorCodeToName() of the engine in the tests).
const (
	codeUnsupportedMethod        = 1
	codeBadArguments             = 36
	codeNotImplemented           = 48
	codeSyntaxError              = 62
	codeUnknownCompressionMethod = 89
	codeTooManySimultaneous      = 202
	codeTimeoutExceeded          = 159
	codeReadonly                 = 164
	codeQueryIsTooLarge          = 229
	codeCannotDecompress         = 271
	codeQueryWasCancelled        = 394
	codeAccessDenied             = 497
	codeRequiredPassword         = 194
	codeAuthenticationFailed     = 516
	codeStdException             = 1001
)

var codeNames = map[int]string{
	codeUnsupportedMethod:        "UNSUPPORTED_METHOD",
	codeBadArguments:             "BAD_ARGUMENTS",
	codeNotImplemented:           "NOT_IMPLEMENTED",
	codeSyntaxError:              "SYNTAX_ERROR",
	codeUnknownCompressionMethod: "UNKNOWN_COMPRESSION_METHOD",
	codeTooManySimultaneous:      "TOO_MANY_SIMULTANEOUS_QUERIES",
	codeTimeoutExceeded:          "TIMEOUT_EXCEEDED",
	codeReadonly:                 "READONLY",
	codeQueryIsTooLarge:          "QUERY_IS_TOO_LARGE",
	codeCannotDecompress:         "CANNOT_DECOMPRESS",
	codeQueryWasCancelled:        "QUERY_WAS_CANCELLED",
	codeAccessDenied:             "ACCESS_DENIED",
	codeRequiredPassword:         "REQUIRED_PASSWORD",
	codeAuthenticationFailed:     "AUTHENTICATION_FAILED",
	codeStdException:             "STD_EXCEPTION",
}

// httpStatus maps a ClickHouse error code to the HTTP status ClickHouse's
// own HTTP handler answers with (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp).
func httpStatus(code int) int {
	switch code {
	case 194: // REQUIRED_PASSWORD
		return http.StatusUnauthorized
	case 192, 193, 516, 512, 497: // UNKNOWN_USER, WRONG_PASSWORD, AUTHENTICATION_FAILED, SET_NON_GRANTED_ROLE, ACCESS_DENIED
		return http.StatusForbidden
	case 36, 427, 6, 25, 26, 38, 41, 72, 441, 675, 676, 27, 376, 15, 44, 37, 123, 8, 167, 168, 223, 62, 117, 53, 321:
		// BAD_ARGUMENTS, CANNOT_COMPILE_REGEXP, CANNOT_PARSE_*, DUPLICATE_COLUMN,
		// ILLEGAL_COLUMN, UNKNOWN_ELEMENT_IN_AST, UNKNOWN_TYPE_OF_AST_NODE,
		// THERE_IS_NO_COLUMN, TOO_DEEP_AST, TOO_BIG_AST, UNEXPECTED_AST_STRUCTURE,
		// SYNTAX_ERROR, INCORRECT_DATA, TYPE_MISMATCH, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
		return http.StatusBadRequest
	case 60, 46, 47, 50, 56, 81, 115, 152, 63, 73, 336, 78, 511:
		// UNKNOWN_TABLE, UNKNOWN_FUNCTION, UNKNOWN_IDENTIFIER, UNKNOWN_TYPE,
		// UNKNOWN_STORAGE, UNKNOWN_DATABASE, UNKNOWN_SETTING,
		// UNKNOWN_DIRECTION_OF_SORTING, UNKNOWN_AGGREGATE_FUNCTION,
		// UNKNOWN_FORMAT, UNKNOWN_DATABASE_ENGINE, UNKNOWN_TYPE_OF_QUERY, UNKNOWN_ROLE
		return http.StatusNotFound
	case 229: // QUERY_IS_TOO_LARGE
		return http.StatusRequestEntityTooLarge
	case 48: // NOT_IMPLEMENTED
		return http.StatusNotImplemented
	case 209, 76, 439: // SOCKET_TIMEOUT, CANNOT_OPEN_FILE, CANNOT_SCHEDULE_TASK
		return http.StatusServiceUnavailable
	case 381: // HTTP_LENGTH_REQUIRED
		return http.StatusLengthRequired
	case 159: // TIMEOUT_EXCEEDED
		return http.StatusRequestTimeout
	case 779: // UNSUPPORTED_MEDIA_TYPE
		return http.StatusUnsupportedMediaType
	}
	return http.StatusInternalServerError
}
