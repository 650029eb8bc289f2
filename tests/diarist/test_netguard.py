import pytest

from diarist.netguard import UnsafeURL, check_url


@pytest.mark.parametrize("url", ["http://127.0.0.1/x", "http://localhost:8000/", "http://10.0.0.5/",
                                 "http://192.168.1.1/", "http://172.16.0.1/", "http://169.254.169.254/latest",
                                 "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/"])
def test_private_addresses_are_refused(url):
    with pytest.raises(UnsafeURL) as e:
        check_url(url)
    assert e.value.code == "url_not_allowed"


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "http:///nohost", "gopher://a/"])
def test_non_http_urls_are_invalid(url):
    with pytest.raises(UnsafeURL) as e:
        check_url(url)
    assert e.value.code == "invalid_url"


def test_allow_list_by_host_ip_and_cidr():
    assert check_url("http://127.0.0.1:5000/h", ["127.0.0.1"])
    assert check_url("http://10.2.3.4/h", ["10.0.0.0/8"])
    assert check_url("http://localhost/h", ["localhost"])
    with pytest.raises(UnsafeURL):
        check_url("http://10.2.3.4/h", ["192.168.0.0/16"])


def test_public_literal_address_passes_without_dns():
    assert check_url("https://8.8.8.8/hook", resolve=False)
    assert check_url("https://hooks.example.com/x", resolve=False)
