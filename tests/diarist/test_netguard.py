import ipaddress

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


NON_GLOBAL = ["100.64.0.1", "100.127.255.254", "198.18.0.1", "192.0.2.10", "192.0.0.1", "240.0.0.1",
              "255.255.255.255", "224.0.0.251", "::", "::1", "fe80::1", "fc00::1", "fd12:3456::1", "2001:db8::1",
              "ff02::1", "::ffff:100.64.0.1", "::ffff:10.0.0.1", "::127.0.0.1", "64:ff9b::a00:1",
              "64:ff9b::6440:1", "2002:7f00:1::1", "2002:6440:1::1"]


@pytest.mark.parametrize("ip", NON_GLOBAL)
def test_every_non_global_literal_is_refused(ip):
    """CGNAT (100.64.0.0/10, accepted by the old is_private test), benchmarking, documentation, reserved,
    multicast and the IPv6 forms that carry such an IPv4 address (mapped, compatible, NAT64, 6to4)."""
    host = f"[{ip}]" if ":" in ip else ip
    with pytest.raises(UnsafeURL) as e:
        check_url(f"http://{host}/hook")
    assert e.value.code == "url_not_allowed" and str(ipaddress.ip_address(ip)) in e.value.message


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
                                "64:ff9b::808:808", "2002:808:808::1"])
def test_global_literals_pass(ip):
    host = f"[{ip}]" if ":" in ip else ip
    assert check_url(f"https://{host}/hook")


def _resolver(monkeypatch, addrs):
    import socket

    def fake(host, port, *a, **kw):
        return [(socket.AF_INET6 if ":" in a_ else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a_, port))
                for a_ in addrs]

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.mark.parametrize("bad", ["100.64.3.4", "fd00::5", "::ffff:169.254.169.254"])
def test_one_non_global_address_among_the_resolved_ones_refuses_the_host(monkeypatch, bad):
    _resolver(monkeypatch, ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", bad])
    with pytest.raises(UnsafeURL) as e:
        check_url("https://hooks.example.com/x")
    assert e.value.code == "url_not_allowed" and str(ipaddress.ip_address(bad)) in e.value.message


def test_a_host_whose_addresses_are_all_global_passes(monkeypatch):
    _resolver(monkeypatch, ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"])
    assert check_url("https://hooks.example.com/x?token=abc") == "https://hooks.example.com/x?token=abc"


def test_refusal_names_the_allow_list_setting_and_not_the_query():
    with pytest.raises(UnsafeURL) as e:
        check_url("http://10.0.0.1/a.wav?X-Amz-Signature=SECRET", setting="DIARIST_AUDIO_URL_ALLOW_HOSTS")
    assert "DIARIST_AUDIO_URL_ALLOW_HOSTS" in e.value.message and "SECRET" not in e.value.message
