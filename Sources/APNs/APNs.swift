/// APNs `pushtotalk` delivery over HTTP/2 (issue 5).
public enum APNs {}
