"""coordinator.etcd over TLS, and the coordinator's etcd as a boundary that
may be missing or refuse it: a one-member etcd started here with a CA, a
server certificate for 127.0.0.1 and client-certificate authentication
(certificates made with openssl for the test).

- With the CA, the client certificate and its key the job runs under etcd
  leadership and ends with the failure-free digests.
- Without the client certificate, with a CA that did not sign the server's,
  or with no etcd listening at all, the runner refuses to start: exit 2, an
  error naming the endpoint, and no agent or rank started.
"""
import os
import subprocess
import time

import pytest

from etcd_cluster import ETCD, free_ports
from ftrun_testlib import ClusterJob, digests, golden, scratch

ARGS = ["--steps", "60", "--state-bytes", "1MiB", "--tensors", "2", "--step-ms", "10"]
BASE = "store:\n  memory_budget: 64MiB\ncluster:\n  replicas: 1\ncoordinator:\n  etcd_endpoints: %s\n"

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed "
                                "(scripts/install-deps.sh installs it)")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_certs(d):
    """ca.pem (and other-ca.pem, which signed nothing here), server.pem for 127.0.0.1, client.pem."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                "-days", "1", "-subj", f"/CN=ftrun-test-{ca}", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=ftrun-test-{name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", "san.ext", cwd=d)


@pytest.fixture(scope="module")
def tls_etcd():
    d = scratch("ftrun-etcd-tls-")
    make_certs(d)
    client, peer = free_ports(2)
    url = f"https://127.0.0.1:{client}"
    log = open(os.path.join(d, "etcd.log"), "w")
    proc = subprocess.Popen(
        [ETCD, "--name", "m0", "--data-dir", os.path.join(d, "data"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"m0=http://127.0.0.1:{peer}",
         "--cert-file", os.path.join(d, "server.pem"), "--key-file", os.path.join(d, "server.key"),
         "--trusted-ca-file", os.path.join(d, "ca.pem"), "--client-cert-auth"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        r = subprocess.run(["curl", "-s", "--cacert", "ca.pem", "--cert", "client.pem", "--key", "client.key",
                            "-X", "POST", url + "/v3/maintenance/status", "-d", "{}"], cwd=d, capture_output=True)
        if b'"leader"' in r.stdout:
            break
        time.sleep(0.1)
    yield d, url
    proc.kill()
    proc.wait()


def tls_config(d, url, ca="ca.pem", cert="client.pem", key="client.key"):
    c = BASE % url + f"  etcd_ca_file: {os.path.join(d, ca)}\n"
    if cert:
        c += f"  etcd_cert_file: {os.path.join(d, cert)}\n  etcd_key_file: {os.path.join(d, key)}\n"
    return c


def test_job_under_tls_etcd(check, tls_etcd):
    d, url = tls_etcd
    want = golden(4, ARGS)
    job = ClusterJob(2, 2, ARGS, config=tls_config(d, url))
    rc = job.wait(timeout=180)
    check(rc == 0, f"the job ends with exit 0 (got {rc}):\n{job.log[-3000:]}")
    check("coordinator: leading the job" in job.log and url in job.log, "the runner leads the job through TLS etcd")
    check(digests(job.log) == want, f"digests equal the failure-free run's ({digests(job.log)} vs {want})")


@pytest.mark.parametrize("case", ["no client certificate", "a CA that did not sign etcd's", "no etcd"])
def test_refused_etcd_stops_the_start(check, tls_etcd, case):
    d, url = tls_etcd
    if case == "no client certificate":
        config = tls_config(d, url, cert=None)
    elif case == "a CA that did not sign etcd's":
        config = tls_config(d, url, ca="other-ca.pem")
    else:
        url = f"http://127.0.0.1:{free_ports(1)[0]}"
        config = BASE % url
    job = ClusterJob(2, 2, ARGS, config=config)
    rc = job.wait(timeout=60)
    check(rc == 2, f"{case}: the runner refuses to start with exit 2 (got {rc}):\n{job.log[-2000:]}")
    check("coordinator.etcd_endpoints: no etcd endpoint answered /v3/lease/grant" in job.log and url in job.log,
          f"{case}: the error names the etcd endpoint:\n{job.log[-2000:]}")
    check("started agent" not in job.log, f"{case}: no agent was started")
