from diarist.redact import display_url, redact_text


def test_display_url_drops_credentials_query_and_fragment():
    assert display_url("https://alice:pw@Bucket.s3.example.com:8443/a/b.wav?X-Amz-Signature=abc&x=1#t=3") == \
        "https://bucket.s3.example.com:8443/a/b.wav"
    assert display_url("http://[::1]:8080/x?token=1") == "http://[::1]:8080/x"
    assert display_url("https://hooks.example.com/path") == "https://hooks.example.com/path"
    assert display_url("http://[bad") == "<url>"


def test_redact_text_rewrites_every_url_in_a_line():
    line = ('HTTP Request: POST http://127.0.0.1:8100/internal/transcribe?options=%7B%22prompt%22%3A%22Acme%22 '
            '"HTTP/1.1 200 OK" then https://u:secret@h.example/hook?sig=zzz done')
    out = redact_text(line)
    assert out == ('HTTP Request: POST http://127.0.0.1:8100/internal/transcribe "HTTP/1.1 200 OK" then '
                   'https://h.example/hook done')
    assert redact_text("no urls here: job_1 ?x=1") == "no urls here: job_1 ?x=1"
