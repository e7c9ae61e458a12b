"""Postfix's parameters that qmgrd does not have: which are fatal, which only warn.

Contract
--------
`classify(name, value)` is asked only about names that are NOT in qmgrd's own
table (`qmgrd.config.params`), so a parameter another change implements stops
being refused the moment it is declared there. It returns:

- ``None``: not a Postfix 3.7 parameter (a user-defined name: the usual
  "unused parameter" warning applies);
- `Verdict` FATAL: a parameter that changes routing, content or security, set
  to a value whose behaviour qmgrd does not have. Running without it would
  fail open (mail unfiltered, unrewritten, routed elsewhere, sent with other
  security), so `load_config` refuses to start (and a reload is refused),
  naming file, line and parameter and saying what to do;
- `Verdict` HARMLESS: every other Postfix parameter (performance hints,
  local-delivery and mailbox settings a relay never uses, daemon plumbing,
  ``compatibility_level``, ...): a warning.

A FATAL parameter set to an empty value, or to Postfix's default, is only a
warning: it then asks for what qmgrd does anyway when the parameter is unset
(the remaining differences are documented in README "Differences from
Postfix"). ``inet_interfaces`` is the exception: its default ``all`` asks for
a listener on the network, which qmgrd's is not; ``loopback-only`` is harmless.

`POSTFIX_NAMES` is every parameter ``postconf -d`` of Postfix 3.7.11 prints.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Kind(enum.Enum):
    """What an unimplemented Postfix parameter means for qmgrd."""

    FATAL = "fatal"
    HARMLESS = "harmless"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The classification of one setting and the text to show the operator."""

    kind: Kind
    text: str


CONTENT = (
    "qmgrd does not inspect, filter or change message content, so mail would pass unchecked; "
    "remove it, or run the filter in front of qmgrd"
)
RECIPIENTS = (
    "qmgrd never adds recipients, so the copies would not be sent; "
    "remove it, or add the recipients before mail reaches qmgrd"
)
REWRITE = (
    "qmgrd never rewrites addresses, so mail would leave with the addresses unchanged; "
    "remove it, or rewrite before mail reaches qmgrd"
)
ROUTING = (
    "qmgrd routes only with transport_maps, default_transport, relayhost and "
    "sender_dependent_relayhost_maps (it has no local, "
    "alias or virtual delivery), so mail would go elsewhere than configured; "
    "express the routing with transport_maps, or remove it"
)
DNS = (
    "qmgrd's SMTP client always looks up MX and address records in DNS and connects to port "
    "25 (or a nexthop's port) over IPv4 and IPv6 without DNSSEC, so delivery would differ; "
    "remove it, or route with transport_maps / relayhost"
)
LISTEN = (
    "qmgrd's listener binds the addresses in smtpd_listen (default 127.0.0.1:25); "
    "set smtpd_listen instead and remove it"
)
BIND = (
    "qmgrd's SMTP client binds smtp_bind_address / smtp_bind_address6 when set but has no "
    "enforcement mode; remove it"
)
CLIENT_TLS = (
    "qmgrd's SMTP client implements the TLS parameters in its table (smtp_tls_security_level "
    "none to secure, CAfile/CApath, cert match, mandatory protocols, wrappermode, policy maps) "
    "but not this one, so this TLS policy would not apply; remove it, or express the policy "
    "with those parameters"
)
CLIENT_SASL = (
    "qmgrd's SMTP client authenticates with smtp_sasl_password_maps and its own SASL code "
    "(no Cyrus or Dovecot plug-ins, no auth cache), so this setting would not apply; remove it"
)
SERVER_TLS = (
    "qmgrd's listener implements smtpd_tls_security_level (none, may, encrypt), "
    "smtpd_tls_cert_file / key_file / chain_files, smtpd_tls_wrappermode, smtpd_tls_auth_only "
    "and the protocol lists, but not this one (no client certificates, no obsolete "
    "smtpd_use_tls / smtpd_enforce_tls), so this TLS policy would not apply; remove it, or "
    "express it with smtpd_tls_security_level"
)
RESTRICTIONS = (
    "qmgrd's listener applies no access restrictions beyond mynetworks (who may relay) and "
    "SMTP AUTH (smtpd_sasl_auth_enable), so this policy would not be enforced; remove it"
)
LIMITS = (
    "qmgrd's listener does not enforce this client limit, so clients would not be limited; "
    "remove it"
)
PROXY = "qmgrd's listener does not speak the HAProxy protocol; remove it"

# name -> (what qmgrd would do instead and what to do, Postfix 3.7's default)
_FATAL: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "header_checks": (CONTENT, ""),
        "body_checks": (CONTENT, ""),
        "mime_header_checks": (CONTENT, "$header_checks"),
        "nested_header_checks": (CONTENT, "$header_checks"),
        "milter_header_checks": (CONTENT, ""),
        "smtp_header_checks": (CONTENT, ""),
        "smtp_body_checks": (CONTENT, ""),
        "smtp_mime_header_checks": (CONTENT, ""),
        "smtp_nested_header_checks": (CONTENT, ""),
        "content_filter": (CONTENT, ""),
        "smtpd_proxy_filter": (CONTENT, ""),
        "smtpd_milters": (CONTENT, ""),
        "non_smtpd_milters": (CONTENT, ""),
        "smtpd_milter_maps": (CONTENT, ""),
        "message_drop_headers": (CONTENT, "bcc, content-length, resent-bcc, return-path"),
        "message_strip_characters": (CONTENT, ""),
        "message_reject_characters": (CONTENT, ""),
        "always_bcc": (RECIPIENTS, ""),
        "sender_bcc_maps": (RECIPIENTS, ""),
        "recipient_bcc_maps": (RECIPIENTS, ""),
        "canonical_maps": (REWRITE, ""),
        "sender_canonical_maps": (REWRITE, ""),
        "recipient_canonical_maps": (REWRITE, ""),
        "masquerade_domains": (REWRITE, ""),
        "smtp_generic_maps": (REWRITE, ""),
        "remote_header_rewrite_domain": (REWRITE, ""),
        "virtual_alias_maps": (REWRITE, "$virtual_maps"),
        "virtual_alias_domains": (REWRITE, "$virtual_alias_maps"),
        "relay_transport": (ROUTING, "relay"),
        "relay_domains": (ROUTING, "${{$compatibility_level} <level {2} ? {$mydestination} : {}}"),
        "mydestination": (ROUTING, "$myhostname, localhost.$mydomain, localhost"),
        "virtual_mailbox_domains": (ROUTING, "$virtual_mailbox_maps"),
        "virtual_mailbox_maps": (ROUTING, ""),
        "virtual_transport": (ROUTING, "virtual"),
        "alias_maps": (ROUTING, "hash:/etc/aliases, nis:mail.aliases"),
        "sender_dependent_default_transport_maps": (ROUTING, ""),
        "fallback_transport": (ROUTING, ""),
        "fallback_transport_maps": (ROUTING, ""),
        "relocated_maps": (ROUTING, ""),
        "best_mx_transport": (ROUTING, ""),
        "relay_recipient_maps": (ROUTING, ""),
        "disable_dns_lookups": (DNS, "no"),
        "smtp_host_lookup": (DNS, "dns"),
        "smtp_dns_support_level": (DNS, ""),
        "smtp_tcp_port": (DNS, "smtp"),
        "inet_protocols": (DNS, "all"),
        "smtp_tls_wrappermode": (DNS, "no"),
        "inet_interfaces": (LISTEN, "all"),
        "smtp_bind_address": (BIND, ""),
        "smtp_bind_address6": (BIND, ""),
        "smtp_bind_address_enforce": (BIND, "no"),
        "smtp_tls_policy_maps": (CLIENT_TLS, ""),
        "smtp_tls_per_site": (CLIENT_TLS, ""),
        "smtp_tls_mandatory_protocols": (CLIENT_TLS, ">=TLSv1"),
        "smtp_tls_protocols": (CLIENT_TLS, ">=TLSv1"),
        "smtp_tls_ciphers": (CLIENT_TLS, "medium"),
        "smtp_tls_mandatory_ciphers": (CLIENT_TLS, "medium"),
        "smtp_tls_exclude_ciphers": (CLIENT_TLS, ""),
        "smtp_tls_mandatory_exclude_ciphers": (CLIENT_TLS, ""),
        "smtp_tls_cert_file": (CLIENT_TLS, ""),
        "smtp_tls_key_file": (CLIENT_TLS, "$smtp_tls_cert_file"),
        "smtp_tls_chain_files": (CLIENT_TLS, ""),
        "smtp_tls_dcert_file": (CLIENT_TLS, ""),
        "smtp_tls_dkey_file": (CLIENT_TLS, "$smtp_tls_dcert_file"),
        "smtp_tls_eccert_file": (CLIENT_TLS, ""),
        "smtp_tls_eckey_file": (CLIENT_TLS, "$smtp_tls_eccert_file"),
        "smtp_tls_CApath": (CLIENT_TLS, ""),
        "smtp_tls_fingerprint_cert_match": (CLIENT_TLS, ""),
        "smtp_tls_secure_cert_match": (CLIENT_TLS, "nexthop, dot-nexthop"),
        "smtp_tls_verify_cert_match": (CLIENT_TLS, "hostname"),
        "smtp_tls_servername": (CLIENT_TLS, ""),
        "smtp_tls_trust_anchor_file": (CLIENT_TLS, ""),
        "smtp_tls_enforce_peername": (CLIENT_TLS, "yes"),
        "smtp_use_tls": (CLIENT_TLS, "no"),
        "smtp_enforce_tls": (CLIENT_TLS, "no"),
        "smtp_tls_block_early_mail_reply": (CLIENT_TLS, "no"),
        "tls_append_default_CA": (CLIENT_TLS, "no"),
        "smtp_sasl_auth_enable": (CLIENT_SASL, "no"),
        "smtp_sasl_password_maps": (CLIENT_SASL, ""),
        "smtp_sasl_security_options": (CLIENT_SASL, "noplaintext, noanonymous"),
        "smtp_sasl_tls_security_options": (CLIENT_SASL, "$smtp_sasl_security_options"),
        "smtp_sasl_tls_verified_security_options": (CLIENT_SASL, "$smtp_sasl_tls_security_options"),
        "smtp_sasl_mechanism_filter": (CLIENT_SASL, ""),
        "smtp_sasl_type": (CLIENT_SASL, "cyrus"),
        "smtp_sasl_path": (CLIENT_SASL, ""),
        "smtp_sender_dependent_authentication": (CLIENT_SASL, "no"),
        "smtp_sasl_auth_soft_bounce": (CLIENT_SASL, "yes"),
        "smtp_sasl_auth_cache_name": (CLIENT_SASL, ""),
        "smtp_send_dummy_mail_auth": (CLIENT_SASL, "no"),
        "smtpd_tls_security_level": (SERVER_TLS, ""),
        "smtpd_use_tls": (SERVER_TLS, "no"),
        "smtpd_enforce_tls": (SERVER_TLS, "no"),
        "smtpd_tls_auth_only": (SERVER_TLS, "no"),
        "smtpd_tls_wrappermode": (SERVER_TLS, "no"),
        "smtpd_tls_req_ccert": (SERVER_TLS, "no"),
        "smtpd_tls_ask_ccert": (SERVER_TLS, "no"),
        "smtpd_client_restrictions": (RESTRICTIONS, ""),
        "smtpd_helo_restrictions": (RESTRICTIONS, ""),
        "smtpd_sender_restrictions": (RESTRICTIONS, ""),
        "smtpd_recipient_restrictions": (RESTRICTIONS, ""),
        "smtpd_relay_restrictions": (
            RESTRICTIONS,
            "permit_mynetworks, permit_sasl_authenticated, defer_unauth_destination",
        ),
        "smtpd_data_restrictions": (RESTRICTIONS, ""),
        "smtpd_end_of_data_restrictions": (RESTRICTIONS, ""),
        "smtpd_helo_required": (RESTRICTIONS, "no"),
        "smtpd_sender_login_maps": (RESTRICTIONS, ""),
        "smtpd_sasl_security_options": (RESTRICTIONS, "noanonymous"),
        "smtpd_sasl_tls_security_options": (RESTRICTIONS, "$smtpd_sasl_security_options"),
        "smtpd_forbid_bare_newline": (RESTRICTIONS, "no"),
        "smtpd_forbid_unauth_pipelining": (RESTRICTIONS, "no"),
        "smtpd_client_connection_count_limit": (LIMITS, "50"),
        "smtpd_client_connection_rate_limit": (LIMITS, "0"),
        "smtpd_client_message_rate_limit": (LIMITS, "0"),
        "smtpd_client_recipient_rate_limit": (LIMITS, "0"),
        "smtpd_client_auth_rate_limit": (LIMITS, "0"),
        "smtpd_junk_command_limit": (LIMITS, "${stress?{1}:{100}}"),
        "smtpd_client_new_tls_session_rate_limit": (LIMITS, "0"),
        "smtpd_upstream_proxy_protocol": (PROXY, ""),
    }
)

# Values other than empty and Postfix's default that ask for what qmgrd does.
_ALSO_HARMLESS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "inet_interfaces": ("loopback-only", "localhost", "127.0.0.1"),
        "inet_protocols": ("ipv4, ipv6", "ipv6, ipv4"),
        "smtpd_relay_restrictions": (
            "permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination",
        ),
        "smtp_tls_CApath": ("/etc/ssl/certs",),
    }
)

_NAMES_TEXT = """
2bounce_notice_recipient access_map_defer_code access_map_reject_code
address_verify_cache_cleanup_interval address_verify_default_transport
address_verify_local_transport address_verify_map address_verify_negative_cache
address_verify_negative_expire_time address_verify_negative_refresh_time
address_verify_pending_request_limit address_verify_poll_count address_verify_poll_delay
address_verify_positive_expire_time address_verify_positive_refresh_time
address_verify_relay_transport address_verify_relayhost address_verify_sender
address_verify_sender_dependent_default_transport_maps
address_verify_sender_dependent_relayhost_maps address_verify_sender_ttl
address_verify_service_name address_verify_transport_maps address_verify_virtual_transport
alias_database alias_maps allow_mail_to_commands allow_mail_to_files allow_min_user
allow_percent_hack allow_untrusted_routing alternate_config_directories
always_add_missing_headers always_bcc anvil_rate_time_unit anvil_status_update_time
append_at_myorigin append_dot_mydomain application_event_drain_time authorized_flush_users
authorized_mailq_users authorized_submit_users backwards_bounce_logfile_compatibility
berkeley_db_create_buffer_size berkeley_db_read_buffer_size best_mx_transport biff body_checks
body_checks_size_limit bounce_notice_recipient bounce_queue_lifetime bounce_service_name
bounce_size_limit bounce_template_file broken_sasl_auth_clients canonical_classes canonical_maps
cleanup_replace_stray_cr_lf cleanup_service_name command_directory command_execution_directory
command_expansion_filter command_time_limit compatibility_level config_directory
confirm_delay_cleared connection_cache_protocol_timeout connection_cache_service_name
connection_cache_status_update_time connection_cache_ttl_limit content_filter
cyrus_sasl_config_path daemon_directory daemon_table_open_error_is_fatal daemon_timeout
data_directory debug_peer_level debug_peer_list debugger_command default_database_type
default_delivery_slot_cost default_delivery_slot_discount default_delivery_slot_loan
default_delivery_status_filter default_destination_concurrency_failed_cohort_limit
default_destination_concurrency_limit default_destination_concurrency_negative_feedback
default_destination_concurrency_positive_feedback default_destination_rate_delay
default_destination_recipient_limit default_extra_recipient_limit default_filter_nexthop
default_minimum_delivery_slots default_privs default_process_limit default_rbl_reply
default_recipient_limit default_recipient_refill_delay default_recipient_refill_limit
default_transport default_transport_rate_delay default_verp_delimiters defer_code
defer_service_name defer_transports delay_logging_resolution_limit delay_notice_recipient
delay_warning_time deliver_lock_attempts deliver_lock_delay
destination_concurrency_feedback_debug detect_8bit_encoding_header disable_dns_lookups
disable_mime_input_processing disable_mime_output_conversion disable_verp_bounces
disable_vrfy_command dns_ncache_ttl_fix_enable dnsblog_reply_delay dnsblog_service_name
dnssec_probe dont_remove double_bounce_sender duplicate_filter_limit
empty_address_default_transport_maps_lookup_key empty_address_local_login_sender_maps_lookup_key
empty_address_recipient empty_address_relayhost_maps_lookup_key enable_idna2003_compatibility
enable_long_queue_ids enable_original_recipient enable_threaded_bounces error_notice_recipient
error_service_name execution_directory_expansion_filter expand_owner_alias export_environment
fallback_transport fallback_transport_maps fast_flush_domains fast_flush_purge_time
fast_flush_refresh_time fault_injection_code flush_service_name fork_attempts fork_delay
forward_expansion_filter forward_path frozen_delivered_to hash_queue_depth hash_queue_names
header_address_token_limit header_checks header_from_format header_size_limit helpful_warnings
home_mailbox hopcount_limit html_directory ignore_mx_lookup_error import_environment
in_flow_delay inet_interfaces inet_protocols info_log_address_format
initial_destination_concurrency internal_mail_filter_classes invalid_hostname_reject_code
ipc_idle ipc_timeout ipc_ttl known_tcp_ports line_length_limit lmdb_map_size
lmtp_address_preference lmtp_address_verify_target lmtp_assume_final lmtp_balance_inet_protocols
lmtp_bind_address lmtp_bind_address6 lmtp_bind_address_enforce lmtp_body_checks
lmtp_cname_overrides_servername lmtp_connect_timeout lmtp_connection_cache_destinations
lmtp_connection_cache_on_demand lmtp_connection_cache_time_limit
lmtp_connection_reuse_count_limit lmtp_connection_reuse_time_limit lmtp_data_done_timeout
lmtp_data_init_timeout lmtp_data_xfer_timeout lmtp_defer_if_no_mx_address_found
lmtp_delivery_status_filter lmtp_discard_lhlo_keyword_address_maps lmtp_discard_lhlo_keywords
lmtp_dns_reply_filter lmtp_dns_resolver_options lmtp_dns_support_level lmtp_enforce_tls
lmtp_fallback_relay lmtp_generic_maps lmtp_header_checks lmtp_host_lookup lmtp_lhlo_name
lmtp_lhlo_timeout lmtp_line_length_limit lmtp_mail_timeout lmtp_mime_header_checks
lmtp_min_data_rate lmtp_mx_address_limit lmtp_mx_session_limit lmtp_nested_header_checks
lmtp_per_request_deadline lmtp_pix_workaround_delay_time lmtp_pix_workaround_maps
lmtp_pix_workaround_threshold_time lmtp_pix_workarounds lmtp_quit_timeout
lmtp_quote_rfc821_envelope lmtp_randomize_addresses lmtp_rcpt_timeout lmtp_reply_filter
lmtp_rset_timeout lmtp_sasl_auth_cache_name lmtp_sasl_auth_cache_time lmtp_sasl_auth_enable
lmtp_sasl_auth_soft_bounce lmtp_sasl_mechanism_filter lmtp_sasl_password_maps lmtp_sasl_path
lmtp_sasl_security_options lmtp_sasl_tls_security_options
lmtp_sasl_tls_verified_security_options lmtp_sasl_type lmtp_send_dummy_mail_auth
lmtp_send_xforward_command lmtp_sender_dependent_authentication lmtp_skip_5xx_greeting
lmtp_skip_quit_response lmtp_starttls_timeout lmtp_tcp_port lmtp_tls_CAfile lmtp_tls_CApath
lmtp_tls_block_early_mail_reply lmtp_tls_cert_file lmtp_tls_chain_files lmtp_tls_ciphers
lmtp_tls_connection_reuse lmtp_tls_dcert_file lmtp_tls_dkey_file lmtp_tls_eccert_file
lmtp_tls_eckey_file lmtp_tls_enforce_peername lmtp_tls_exclude_ciphers
lmtp_tls_fingerprint_cert_match lmtp_tls_fingerprint_digest
lmtp_tls_force_insecure_host_tlsa_lookup lmtp_tls_key_file lmtp_tls_loglevel
lmtp_tls_mandatory_ciphers lmtp_tls_mandatory_exclude_ciphers lmtp_tls_mandatory_protocols
lmtp_tls_note_starttls_offer lmtp_tls_per_site lmtp_tls_policy_maps lmtp_tls_protocols
lmtp_tls_scert_verifydepth lmtp_tls_secure_cert_match lmtp_tls_security_level
lmtp_tls_servername lmtp_tls_session_cache_database lmtp_tls_session_cache_timeout
lmtp_tls_trust_anchor_file lmtp_tls_verify_cert_match lmtp_tls_wrappermode lmtp_use_tls
lmtp_xforward_timeout local_command_shell local_delivery_status_filter
local_destination_concurrency_limit local_destination_recipient_limit
local_header_rewrite_clients local_login_sender_maps local_recipient_maps local_transport
luser_relay mail_name mail_owner mail_release_date mail_spool_directory mail_version
mailbox_command mailbox_command_maps mailbox_delivery_lock mailbox_size_limit mailbox_transport
mailbox_transport_maps maillog_file maillog_file_compressor maillog_file_prefixes
maillog_file_rotate_suffix mailq_path manpage_directory maps_rbl_domains maps_rbl_reject_code
masquerade_classes masquerade_domains masquerade_exceptions master_service_disable max_idle
max_use maximal_backoff_time maximal_queue_lifetime message_drop_headers
message_reject_characters message_size_limit message_strip_characters meta_directory
milter_command_timeout milter_connect_macros milter_connect_timeout milter_content_timeout
milter_data_macros milter_default_action milter_end_of_data_macros milter_end_of_header_macros
milter_header_checks milter_helo_macros milter_macro_daemon_name milter_macro_defaults
milter_macro_v milter_mail_macros milter_protocol milter_rcpt_macros
milter_unknown_command_macros mime_boundary_length_limit mime_header_checks mime_nesting_limit
minimal_backoff_time multi_instance_directories multi_instance_enable multi_instance_group
multi_instance_name multi_instance_wrapper multi_recipient_bounce_reject_code mydestination
mydomain myhostname mynetworks mynetworks_style myorigin nested_header_checks newaliases_path
non_fqdn_reject_code non_smtpd_milters notify_classes openssl_path owner_request_special
parent_domain_matches_subdomains permit_mx_backup_networks pickup_service_name
pipe_delivery_status_filter plaintext_reject_code postlog_service_name postlogd_watchdog_timeout
postmulti_control_commands postmulti_start_commands postmulti_stop_commands
postscreen_access_list postscreen_allowlist_interfaces postscreen_bare_newline_action
postscreen_bare_newline_enable postscreen_bare_newline_ttl postscreen_cache_cleanup_interval
postscreen_cache_map postscreen_cache_retention_time postscreen_client_connection_count_limit
postscreen_command_count_limit postscreen_command_filter postscreen_command_time_limit
postscreen_denylist_action postscreen_disable_vrfy_command
postscreen_discard_ehlo_keyword_address_maps postscreen_discard_ehlo_keywords
postscreen_dnsbl_action postscreen_dnsbl_allowlist_threshold postscreen_dnsbl_max_ttl
postscreen_dnsbl_min_ttl postscreen_dnsbl_reply_map postscreen_dnsbl_sites
postscreen_dnsbl_threshold postscreen_dnsbl_timeout postscreen_enforce_tls
postscreen_expansion_filter postscreen_forbidden_commands postscreen_greet_action
postscreen_greet_banner postscreen_greet_ttl postscreen_greet_wait postscreen_helo_required
postscreen_non_smtp_command_action postscreen_non_smtp_command_enable
postscreen_non_smtp_command_ttl postscreen_pipelining_action postscreen_pipelining_enable
postscreen_pipelining_ttl postscreen_post_queue_limit postscreen_pre_queue_limit
postscreen_reject_footer postscreen_reject_footer_maps postscreen_tls_security_level
postscreen_upstream_proxy_protocol postscreen_upstream_proxy_timeout postscreen_use_tls
postscreen_watchdog_timeout prepend_delivered_header process_id process_id_directory
process_name propagate_unmatched_extensions proxy_interfaces proxy_read_maps proxy_write_maps
proxymap_service_name proxywrite_service_name qmgr_clog_warn_time qmgr_daemon_timeout
qmgr_fudge_factor qmgr_ipc_timeout qmgr_message_active_limit qmgr_message_recipient_limit
qmgr_message_recipient_minimum qmqpd_authorized_clients qmqpd_client_port_logging
qmqpd_error_delay qmqpd_timeout queue_directory queue_file_attribute_count_limit queue_minfree
queue_run_delay queue_service_name rbl_reply_maps readme_directory receive_override_options
recipient_bcc_maps recipient_canonical_classes recipient_canonical_maps recipient_delimiter
reject_code reject_tempfail_action relay_clientcerts relay_domains relay_domains_reject_code
relay_recipient_maps relay_transport relayhost relocated_maps remote_header_rewrite_domain
require_home_directory reset_owner_alias resolve_dequoted_address resolve_null_domain
resolve_numeric_domain respectful_logging rewrite_service_name sample_directory
send_cyrus_sasl_authzid sender_bcc_maps sender_canonical_classes sender_canonical_maps
sender_dependent_default_transport_maps sender_dependent_relayhost_maps
sendmail_fix_line_endings sendmail_path service_name service_throttle_time setgid_group
shlib_directory show_user_unknown_table_name showq_service_name smtp_address_preference
smtp_address_verify_target smtp_always_send_ehlo smtp_balance_inet_protocols smtp_bind_address
smtp_bind_address6 smtp_bind_address_enforce smtp_body_checks smtp_cname_overrides_servername
smtp_connect_timeout smtp_connection_cache_destinations smtp_connection_cache_on_demand
smtp_connection_cache_time_limit smtp_connection_reuse_count_limit
smtp_connection_reuse_time_limit smtp_data_done_timeout smtp_data_init_timeout
smtp_data_xfer_timeout smtp_defer_if_no_mx_address_found smtp_delivery_status_filter
smtp_discard_ehlo_keyword_address_maps smtp_discard_ehlo_keywords smtp_dns_reply_filter
smtp_dns_resolver_options smtp_dns_support_level smtp_enforce_tls smtp_fallback_relay
smtp_generic_maps smtp_header_checks smtp_helo_name smtp_helo_timeout smtp_host_lookup
smtp_line_length_limit smtp_mail_timeout smtp_mime_header_checks smtp_min_data_rate
smtp_mx_address_limit smtp_mx_session_limit smtp_nested_header_checks smtp_never_send_ehlo
smtp_per_request_deadline smtp_pix_workaround_delay_time smtp_pix_workaround_maps
smtp_pix_workaround_threshold_time smtp_pix_workarounds smtp_quit_timeout
smtp_quote_rfc821_envelope smtp_randomize_addresses smtp_rcpt_timeout smtp_reply_filter
smtp_rset_timeout smtp_sasl_auth_cache_name smtp_sasl_auth_cache_time smtp_sasl_auth_enable
smtp_sasl_auth_soft_bounce smtp_sasl_mechanism_filter smtp_sasl_password_maps smtp_sasl_path
smtp_sasl_security_options smtp_sasl_tls_security_options
smtp_sasl_tls_verified_security_options smtp_sasl_type smtp_send_dummy_mail_auth
smtp_send_xforward_command smtp_sender_dependent_authentication smtp_skip_5xx_greeting
smtp_skip_quit_response smtp_starttls_timeout smtp_tcp_port smtp_tls_CAfile smtp_tls_CApath
smtp_tls_block_early_mail_reply smtp_tls_cert_file smtp_tls_chain_files smtp_tls_ciphers
smtp_tls_connection_reuse smtp_tls_dane_insecure_mx_policy smtp_tls_dcert_file
smtp_tls_dkey_file smtp_tls_eccert_file smtp_tls_eckey_file smtp_tls_enforce_peername
smtp_tls_exclude_ciphers smtp_tls_fingerprint_cert_match smtp_tls_fingerprint_digest
smtp_tls_force_insecure_host_tlsa_lookup smtp_tls_key_file smtp_tls_loglevel
smtp_tls_mandatory_ciphers smtp_tls_mandatory_exclude_ciphers smtp_tls_mandatory_protocols
smtp_tls_note_starttls_offer smtp_tls_per_site smtp_tls_policy_maps smtp_tls_protocols
smtp_tls_scert_verifydepth smtp_tls_secure_cert_match smtp_tls_security_level
smtp_tls_servername smtp_tls_session_cache_database smtp_tls_session_cache_timeout
smtp_tls_trust_anchor_file smtp_tls_verify_cert_match smtp_tls_wrappermode smtp_use_tls
smtp_xforward_timeout smtpd_authorized_verp_clients smtpd_authorized_xclient_hosts
smtpd_authorized_xforward_hosts smtpd_banner smtpd_client_auth_rate_limit
smtpd_client_connection_count_limit smtpd_client_connection_rate_limit
smtpd_client_event_limit_exceptions smtpd_client_message_rate_limit
smtpd_client_new_tls_session_rate_limit smtpd_client_port_logging
smtpd_client_recipient_rate_limit smtpd_client_restrictions smtpd_command_filter
smtpd_data_restrictions smtpd_delay_open_until_valid_rcpt smtpd_delay_reject
smtpd_discard_ehlo_keyword_address_maps smtpd_discard_ehlo_keywords smtpd_dns_reply_filter
smtpd_end_of_data_restrictions smtpd_enforce_tls smtpd_error_sleep_time smtpd_etrn_restrictions
smtpd_expansion_filter smtpd_forbid_bare_newline smtpd_forbid_bare_newline_exclusions
smtpd_forbid_bare_newline_reject_code smtpd_forbid_unauth_pipelining smtpd_forbidden_commands
smtpd_hard_error_limit smtpd_helo_required smtpd_helo_restrictions smtpd_history_flush_threshold
smtpd_junk_command_limit smtpd_log_access_permit_actions smtpd_milter_maps smtpd_milters
smtpd_min_data_rate smtpd_noop_commands smtpd_null_access_lookup_key smtpd_peername_lookup
smtpd_per_request_deadline smtpd_policy_service_default_action smtpd_policy_service_max_idle
smtpd_policy_service_max_ttl smtpd_policy_service_policy_context
smtpd_policy_service_request_limit smtpd_policy_service_retry_delay smtpd_policy_service_timeout
smtpd_policy_service_try_limit smtpd_proxy_ehlo smtpd_proxy_filter smtpd_proxy_options
smtpd_proxy_timeout smtpd_recipient_limit smtpd_recipient_overshoot_limit
smtpd_recipient_restrictions smtpd_reject_footer smtpd_reject_footer_maps
smtpd_reject_unlisted_recipient smtpd_reject_unlisted_sender
smtpd_relay_before_recipient_restrictions smtpd_relay_restrictions smtpd_restriction_classes
smtpd_sasl_auth_enable smtpd_sasl_authenticated_header smtpd_sasl_exceptions_networks
smtpd_sasl_local_domain smtpd_sasl_mechanism_filter smtpd_sasl_path smtpd_sasl_response_limit
smtpd_sasl_security_options smtpd_sasl_service smtpd_sasl_tls_security_options smtpd_sasl_type
smtpd_sender_login_maps smtpd_sender_restrictions smtpd_service_name smtpd_soft_error_limit
smtpd_starttls_timeout smtpd_timeout smtpd_tls_CAfile smtpd_tls_CApath
smtpd_tls_always_issue_session_ids smtpd_tls_ask_ccert smtpd_tls_auth_only
smtpd_tls_ccert_verifydepth smtpd_tls_cert_file smtpd_tls_chain_files smtpd_tls_ciphers
smtpd_tls_dcert_file smtpd_tls_dh1024_param_file smtpd_tls_dh512_param_file smtpd_tls_dkey_file
smtpd_tls_eccert_file smtpd_tls_eckey_file smtpd_tls_eecdh_grade smtpd_tls_exclude_ciphers
smtpd_tls_fingerprint_digest smtpd_tls_key_file smtpd_tls_loglevel smtpd_tls_mandatory_ciphers
smtpd_tls_mandatory_exclude_ciphers smtpd_tls_mandatory_protocols smtpd_tls_protocols
smtpd_tls_received_header smtpd_tls_req_ccert smtpd_tls_security_level
smtpd_tls_session_cache_database smtpd_tls_session_cache_timeout smtpd_tls_wrappermode
smtpd_upstream_proxy_protocol smtpd_upstream_proxy_timeout smtpd_use_tls
smtputf8_autodetect_classes smtputf8_enable soft_bounce stale_lock_time stress
strict_7bit_headers strict_8bitmime strict_8bitmime_body strict_mailbox_ownership
strict_mime_encoding_domain strict_rfc821_envelopes strict_smtputf8 sun_mailtool_compatibility
swap_bangpath syslog_facility syslog_name tcp_windowsize tls_append_default_CA tls_config_file
tls_config_name tls_daemon_random_bytes tls_dane_digests tls_disable_workarounds
tls_eecdh_auto_curves tls_eecdh_strong_curve tls_eecdh_ultra_curve tls_export_cipherlist
tls_fast_shutdown_enable tls_high_cipherlist tls_legacy_public_key_fingerprints
tls_low_cipherlist tls_medium_cipherlist tls_null_cipherlist tls_preempt_cipherlist
tls_random_bytes tls_random_exchange_name tls_random_prng_update_period tls_random_reseed_period
tls_random_source tls_server_sni_maps tls_session_ticket_cipher tls_ssl_options
tls_wildcard_matches_multiple_labels tlsmgr_service_name tlsproxy_client_CAfile
tlsproxy_client_CApath tlsproxy_client_cert_file tlsproxy_client_chain_files
tlsproxy_client_dcert_file tlsproxy_client_dkey_file tlsproxy_client_eccert_file
tlsproxy_client_eckey_file tlsproxy_client_enforce_tls tlsproxy_client_fingerprint_digest
tlsproxy_client_key_file tlsproxy_client_loglevel tlsproxy_client_loglevel_parameter
tlsproxy_client_per_site tlsproxy_client_policy_maps tlsproxy_client_scert_verifydepth
tlsproxy_client_security_level tlsproxy_client_use_tls tlsproxy_enforce_tls
tlsproxy_service_name tlsproxy_tls_CAfile tlsproxy_tls_CApath
tlsproxy_tls_always_issue_session_ids tlsproxy_tls_ask_ccert tlsproxy_tls_ccert_verifydepth
tlsproxy_tls_cert_file tlsproxy_tls_chain_files tlsproxy_tls_ciphers tlsproxy_tls_dcert_file
tlsproxy_tls_dh1024_param_file tlsproxy_tls_dh512_param_file tlsproxy_tls_dkey_file
tlsproxy_tls_eccert_file tlsproxy_tls_eckey_file tlsproxy_tls_eecdh_grade
tlsproxy_tls_exclude_ciphers tlsproxy_tls_fingerprint_digest tlsproxy_tls_key_file
tlsproxy_tls_loglevel tlsproxy_tls_mandatory_ciphers tlsproxy_tls_mandatory_exclude_ciphers
tlsproxy_tls_mandatory_protocols tlsproxy_tls_protocols tlsproxy_tls_req_ccert
tlsproxy_tls_security_level tlsproxy_use_tls tlsproxy_watchdog_timeout trace_service_name
transport_maps transport_retry_time trigger_timeout undisclosed_recipients_header
unknown_address_reject_code unknown_address_tempfail_action unknown_client_reject_code
unknown_helo_hostname_tempfail_action unknown_hostname_reject_code
unknown_local_recipient_reject_code unknown_relay_recipient_reject_code
unknown_virtual_alias_reject_code unknown_virtual_mailbox_reject_code
unverified_recipient_defer_code unverified_recipient_reject_code
unverified_recipient_reject_reason unverified_recipient_tempfail_action
unverified_sender_defer_code unverified_sender_reject_code unverified_sender_reject_reason
unverified_sender_tempfail_action verp_delimiter_filter virtual_alias_address_length_limit
virtual_alias_domains virtual_alias_expansion_limit virtual_alias_maps
virtual_alias_recursion_limit virtual_delivery_status_filter virtual_gid_maps
virtual_mailbox_base virtual_mailbox_domains virtual_mailbox_limit virtual_mailbox_lock
virtual_mailbox_maps virtual_minimum_uid virtual_transport virtual_uid_maps
"""
# Postfix's default asks for something qmgrd does not do (inet_interfaces = all: listen on
# the network), so writing it down explicitly is refused too.
_DEFAULT_NOT_HARMLESS = frozenset({"inet_interfaces"})

POSTFIX_NAMES: frozenset[str] = frozenset(_NAMES_TEXT.split())
"""Every parameter of Postfix 3.7.11 (``postconf -d``)."""

_SPLIT_RE = re.compile(r"[\s,]+")


def _normalized(value: str) -> tuple[str, ...]:
    return tuple(part for part in _SPLIT_RE.split(value.strip().lower()) if part)


def is_fatal_name(name: str) -> bool:
    """True for a parameter refused when set to a value qmgrd cannot honour."""
    return name in _FATAL


def fatal_names() -> list[tuple[str, str]]:
    """(name, reason) of every parameter that can be fatal, sorted (for the README)."""
    return sorted((name, hint) for name, (hint, _default) in _FATAL.items())


def classify(name: str, value: str) -> Verdict | None:
    """The verdict on ``name = value`` for a name not in qmgrd's table (module doc)."""
    fatal = _FATAL.get(name)
    if fatal is not None:
        hint, default = fatal
        shown = _normalized(value)
        harmless = {(), *map(_normalized, _ALSO_HARMLESS.get(name, ()))}
        if name not in _DEFAULT_NOT_HARMLESS:
            harmless.add(_normalized(default))
        if shown not in harmless:
            return Verdict(Kind.FATAL, f"qmgrd does not implement Postfix parameter {name}: {hint}")
        return Verdict(
            Kind.HARMLESS,
            f"ignoring Postfix parameter {name} (qmgrd does not implement it; this value asks "
            "for what qmgrd does anyway)",
        )
    if name in POSTFIX_NAMES:
        return Verdict(
            Kind.HARMLESS,
            f"ignoring Postfix parameter {name} "
            "(qmgrd does not implement it; harmless for a relay)",
        )
    return None
