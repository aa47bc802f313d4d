package chhttp

import (
	"net/http"

	"github.com/ClickHouse/ch-go/proto"
)

// httpStatus maps a ClickHouse error code to the HTTP status ClickHouse's
// own HTTP handler answers with (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp).
func httpStatus(code proto.Error) int {
	switch code {
	case proto.ErrRequiredPassword:
		return http.StatusUnauthorized
	case proto.ErrUnknownUser, proto.ErrWrongPassword, proto.ErrAuthenticationFailed, proto.ErrSetNonGrantedRole, proto.ErrAccessDenied:
		return http.StatusForbidden
	case proto.ErrBadArguments, proto.ErrCannotCompileRegexp, proto.ErrCannotParseText, proto.ErrCannotParseEscapeSequence,
		proto.ErrCannotParseQuotedString, proto.ErrCannotParseDate, proto.ErrCannotParseDatetime, proto.ErrCannotParseNumber,
		proto.ErrCannotParseDomainValueFromString, proto.ErrCannotParseIpv4, proto.ErrCannotParseIpv6,
		proto.ErrCannotParseInputAssertionFailed, proto.ErrCannotParseUUID, proto.ErrDuplicateColumn, proto.ErrIllegalColumn,
		proto.ErrUnknownElementInAst, proto.ErrUnknownTypeOfAstNode, proto.ErrThereIsNoColumn, proto.ErrTooDeepAst,
		proto.ErrTooBigAst, proto.ErrUnexpectedAstStructure, proto.ErrSyntaxError, proto.ErrIncorrectData,
		proto.ErrTypeMismatch, proto.ErrValueIsOutOfRangeOfDataType:
		return http.StatusBadRequest
	case proto.ErrUnknownTable, proto.ErrUnknownFunction, proto.ErrUnknownIdentifier, proto.ErrUnknownType,
		proto.ErrUnknownStorage, proto.ErrUnknownDatabase, proto.ErrUnknownSetting, proto.ErrUnknownDirectionOfSorting,
		proto.ErrUnknownAggregateFunction, proto.ErrUnknownFormat, proto.ErrUnknownDatabaseEngine,
		proto.ErrUnknownTypeOfQuery, proto.ErrUnknownRole:
		return http.StatusNotFound
	case proto.ErrQueryIsTooLarge:
		return http.StatusRequestEntityTooLarge
	case proto.ErrNotImplemented:
		return http.StatusNotImplemented
	case proto.ErrSocketTimeout, proto.ErrCannotOpenFile, proto.ErrCannotScheduleTask:
		return http.StatusServiceUnavailable
	case proto.ErrHTTPLengthRequired:
		return http.StatusLengthRequired
	case proto.ErrTimeoutExceeded:
		return http.StatusRequestTimeout
	case 779: // UNSUPPORTED_MEDIA_TYPE, newer than ch-go's list
		return http.StatusUnsupportedMediaType
	}
	return http.StatusInternalServerError
}
